"""Stage 1 of CBPO: entropy-guided balanced branch exploration (Sec. 4.2, Eqs. 5-10,
Algorithm 1 lines 9-22).

All positions count model-generated tokens only; observation tokens are never scanned.
The allocation depends only on the parents' entropies, never on branch outcomes, so the whole
plan is returned up front and a rollout engine can sample every branch of a step in one call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from cbpo.config import CBPOConfig


@dataclass
class ParentCandidates:
    """The retained candidate nodes of one parent (Algorithm 1 lines 11-12)."""

    positions: np.ndarray  # boundary b of each retained candidate (model-token index)
    priority: np.ndarray  # P^raw of each retained candidate (Eq. 9)


@dataclass
class BranchPlan:
    """Branches in allocation order, each ``(parent index, boundary b)``, plus filler count."""

    branches: list[tuple[int, int]] = field(default_factory=list)
    fill: int = 0
    candidates: list[ParentCandidates] = field(default_factory=list)


def candidate_boundaries(n_tokens: int, w: int, d_min: int) -> np.ndarray:
    """Eq. 5: b_q = q * d_min for q >= 1, kept while the whole window fits (b + w <= n)."""
    q_max = (n_tokens - w) // d_min
    return d_min * np.arange(1, max(q_max, 0) + 1, dtype=np.int64)


def window_entropy(token_entropy: np.ndarray, starts: np.ndarray, w: int, vocab_size: int) -> np.ndarray:
    """Eq. 6: H_{i,b} = -(1 / (|W| log|V|)) sum_{t in W_{i,b}} sum_{v in top-K} p log p.

    ``token_entropy[t]`` is already the truncated top-K sum ``-sum p log p`` of token t.
    Windows must fit: ``starts + w <= len``.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size == 0:
        return np.zeros(0)
    # reduceat over (start, start + w) pairs sums exactly the windows (every other output);
    # it touches only the spans it needs, unlike a full prefix sum. The appended 0 keeps an
    # end index equal to the length valid.
    ent = np.append(np.asarray(token_entropy, dtype=np.float64), 0.0)
    sums = np.add.reduceat(ent, np.stack((starts, starts + w), axis=1).ravel())[::2]
    return sums / (w * np.log(vocab_size))


def raw_priority(h: np.ndarray, h_root: float, alpha: float, gamma: float) -> np.ndarray:
    """Eqs. 7-9: P^raw = clip(alpha + gamma * (H_{i,b} - H_i^root), 0, 1)."""
    return np.clip(alpha + gamma * (np.asarray(h, dtype=np.float64) - h_root), 0.0, 1.0)


def scan_parents(
    parent_entropies: Sequence[Sequence[float]],
    vocab_size: int,
    cfg: CBPOConfig,
    tool_boundaries: Sequence[Sequence[int] | None] | None = None,
) -> list[ParentCandidates]:
    """Algorithm 1 lines 10-12 for every parent of a problem: candidates, P^raw, top-J_max.

    With any ``cfg.candidates`` but ``"full"`` the candidates are the given positions where the
    model resumes after a tool observation (b > 0, window fitting) instead of Eq. 5's grid (the
    caller picks them: all, the alive ones, or the frontier, ``cbpo.config.CANDIDATES``).
    A parent shorter than w has no root window and hence no candidates. All parents are scanned
    with one prefix sum over their concatenated entropies.
    """
    ents = [np.asarray(e, dtype=np.float64) for e in parent_entropies]
    bounds = tool_boundaries or [None] * len(ents)
    lengths = np.array([e.shape[0] for e in ents], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(ents) else lengths
    cand = []
    for e_len, tb in zip(lengths, bounds):
        if e_len < cfg.w:
            pos = np.zeros(0, dtype=np.int64)
        elif cfg.candidates == "full":
            pos = candidate_boundaries(int(e_len), cfg.w, cfg.d_min)
        else:
            pos = np.unique(np.asarray(list(tb or ()), dtype=np.int64))
            pos = pos[(pos > 0) & (pos + cfg.w <= e_len)]
        cand.append(pos)
    counts = np.array([len(c) for c in cand], dtype=np.int64)
    owner = np.repeat(np.arange(len(ents)), counts)
    if owner.size == 0:
        return [ParentCandidates(np.zeros(0, dtype=np.int64), np.zeros(0)) for _ in ents]
    pos = np.concatenate(cand)
    flat = np.concatenate(ents)
    # Every candidate's window and its parent's root window (Eqs. 6-7), in one pass.
    h = window_entropy(flat, np.concatenate((offsets[owner] + pos, offsets[owner])), cfg.w, vocab_size)
    prio = raw_priority(h[: pos.size], h[pos.size :], cfg.alpha, cfg.gamma)
    # Top-J_max per parent by P^raw; ties keep the earlier position (stable order).
    order = np.lexsort((np.arange(pos.size), -prio, owner))
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(pos.size) - first[owner[order]]
    keep = np.sort(order[rank < cfg.top_j])
    split = np.cumsum(np.minimum(counts, cfg.top_j))[:-1]
    return [ParentCandidates(p, q) for p, q in zip(np.split(pos[keep], split), np.split(prio[keep], split))]


def scan_parent(
    token_entropy: Sequence[float],
    vocab_size: int,
    cfg: CBPOConfig,
    tool_boundaries: Sequence[int] | None = None,
) -> ParentCandidates:
    """``scan_parents`` for a single parent."""
    return scan_parents([token_entropy], vocab_size, cfg, [tool_boundaries])[0]


def balanced_priority(p_raw, path_count, node_count, rho_path: float, rho_node: float):
    """Eq. 10: P^bal = P^raw / ((1 + L_i)^rho_path (1 + l_{i,b})^rho_node)."""
    return p_raw / ((1.0 + path_count) ** rho_path * (1.0 + node_count) ** rho_node)


def allocate_branches(candidates: Sequence[ParentCandidates], slots: int, cfg: CBPOConfig) -> BranchPlan:
    """Algorithm 1 lines 13-22: spend ``slots`` = M - N_0 rollouts on branches or fillers.

    Greedy on Eq. 10 with hard caps L_i < B_path and l_{i,b} < B_node; a branch needs P^bal
    strictly above kappa, otherwise (or when nothing is eligible) every remaining slot becomes
    an independent complete trajectory. Ties go to the earlier parent, then earlier position.
    """
    if slots < 0:
        raise ValueError(f"more parents than the rollout budget allows ({-slots} too many)")
    # At most J_max candidates per parent and M - N_0 steps: plain Python beats numpy here.
    nodes = [(i, int(b), float(p)) for i, c in enumerate(candidates) for b, p in zip(c.positions, c.priority)]
    # The decay denominators of Eq. 10 take only B_path x B_node values: tabulate them.
    path_decay = [balanced_priority(1.0, n, 0, cfg.rho_path, 0.0) for n in range(cfg.b_path)]
    node_decay = [balanced_priority(1.0, 0, n, 0.0, cfg.rho_node) for n in range(cfg.b_node)]
    path_count = [0] * len(candidates)
    node_count = [0] * len(nodes)
    plan = BranchPlan(candidates=list(candidates))
    while len(plan.branches) < slots:
        best, best_p = -1, -1.0
        for n, (i, _, p_raw) in enumerate(nodes):
            if path_count[i] >= cfg.b_path or node_count[n] >= cfg.b_node:
                continue
            p_bal = p_raw * path_decay[path_count[i]] * node_decay[node_count[n]]
            if p_bal > best_p:  # strict: (parent, position) order decides ties
                best, best_p = n, p_bal
        if best < 0 or not best_p > cfg.kappa:
            break
        i, b, _ = nodes[best]
        plan.branches.append((i, b))
        path_count[i] += 1
        node_count[best] += 1
    plan.fill = slots - len(plan.branches)
    return plan


def plan_branches(
    parent_entropies: Sequence[Sequence[float]],
    vocab_size: int,
    cfg: CBPOConfig,
    tool_boundaries: Sequence[Sequence[int] | None] | None = None,
    budget: int | None = None,
) -> BranchPlan:
    """Stage 1 for one problem: scan every parent, then allocate the remaining budget.

    ``len(plan.branches) + plan.fill == budget - len(parent_entropies)`` always holds.
    """
    budget = cfg.budget if budget is None else budget
    cands = scan_parents(parent_entropies, vocab_size, cfg, tool_boundaries)
    return allocate_branches(cands, budget - len(parent_entropies), cfg)
