"""Stage 2 of CBPO: hierarchical policy optimisation with the Contrastive Branch Value
(Sec. 4.3, Eqs. 3, 13-19; Algorithm 1 lines 23-26).

Inputs are outcome rewards and the branch structure of each problem's rollout set R_x; outputs
are per-model-token advantages and loss masks. Pure numpy, float64.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from cbpo.config import CBPOConfig

KINDS = ("parent", "branch", "fill")


@dataclass
class ProblemRollouts:
    """The rollout set R_x of one problem. ``parent[k]`` indexes into the same set and ``at[k]``
    is the branch boundary (model tokens) for branches; both are -1 for parents and fillers.
    ``n_tokens`` counts model tokens, a branch's including its copied prefix."""

    rewards: np.ndarray
    kinds: Sequence[str]
    parent: np.ndarray
    at: np.ndarray
    n_tokens: np.ndarray

    def __post_init__(self) -> None:
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        self.parent = np.asarray(self.parent, dtype=np.int64)
        self.at = np.asarray(self.at, dtype=np.int64)
        self.n_tokens = np.asarray(self.n_tokens, dtype=np.int64)
        m = len(self.rewards)
        if not (len(self.kinds) == len(self.parent) == len(self.at) == len(self.n_tokens) == m):
            raise ValueError("rewards, kinds, parent, at and n_tokens must have equal lengths")
        for k, kind in enumerate(self.kinds):
            if kind not in KINDS:
                raise ValueError(f"rollout {k}: kind must be one of {KINDS}, got {kind!r}")
            if kind != "branch":
                continue
            p, b = int(self.parent[k]), int(self.at[k])
            if not (0 <= p < m and self.kinds[p] == "parent"):
                raise ValueError(f"rollout {k}: a branch's parent must be a parent rollout of the same problem")
            if not 0 <= b < self.n_tokens[p] or self.n_tokens[k] < b:
                raise ValueError(f"rollout {k}: branch point {b} outside its parent ({self.n_tokens[p]} tokens) or itself ({self.n_tokens[k]})")


@dataclass
class Node:
    """An exact-prefix group G(p_b): the parent at boundary b and the branches sampled there."""

    problem: int
    parent: int
    at: int
    members: np.ndarray  # parent first, then its branches at b
    cbv: float = 0.0
    z: float = 0.0
    shared: float = 0.0  # A^shared (Eq. 15)
    final: np.ndarray = field(default_factory=lambda: np.zeros(0))  # A^final per member (Eq. 17)


@dataclass
class Credit:
    advantages: list[list[np.ndarray]]  # [problem][rollout] -> per-model-token advantage
    loss_masks: list[list[np.ndarray]]  # [problem][rollout] -> 0/1 per model token
    base: list[np.ndarray]  # [problem] -> base advantage per rollout (Eq. 3)
    nodes: list[Node]


def grpo_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Eq. 3 over all M rollouts of a problem: (R - mean) / (std + eps), std with ddof=1 as
    verl and TRL compute GRPO. A single rollout has no spread and gets advantage 0."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2:
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def exact_prefix_groups(kinds: Sequence[str], parent: np.ndarray, at: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(parent, b, members) for every node with at least one branch, ordered by parent then b;
    members lists the parent first, then its branches at b in input order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for k, kind in enumerate(kinds):
        if kind == "branch":
            groups.setdefault((int(parent[k]), int(at[k])), []).append(k)
    return [(p, b, np.array([p, *ks], dtype=np.int64)) for (p, b), ks in sorted(groups.items())]


def contrastive_branch_value(rewards: np.ndarray, node_of: np.ndarray | None = None) -> float | np.ndarray:
    """Eq. 13: CBV_i = population standard deviation of the exact-prefix group's rewards.
    With ``node_of`` (the group index of each reward) every group's CBV at once."""
    r = np.asarray(rewards, dtype=np.float64)
    if node_of is None:
        return float(np.std(r))
    n = int(node_of.max()) + 1 if node_of.size else 0
    size = np.maximum(np.bincount(node_of, minlength=n), 1)
    mean = np.bincount(node_of, r, n) / size
    return np.sqrt(np.bincount(node_of, (r - mean[node_of]) ** 2, n) / size)


def standardize_cbv(cbv: np.ndarray, eps: float = 1e-6, threshold: float = 1e-6) -> np.ndarray:
    """Eq. 14 across all valid nodes of the batch (population mean/std); if sigma_CBV falls
    below the threshold every Z is 0, so base advantages are kept."""
    cbv = np.asarray(cbv, dtype=np.float64)
    if cbv.size == 0:
        return cbv
    sigma = cbv.std()
    if sigma < threshold:
        return np.zeros_like(cbv)
    return (cbv - cbv.mean()) / (sigma + eps)


def modulate(advantage: np.ndarray, z: float | np.ndarray, eta: float, phi: float) -> np.ndarray:
    """Eqs. 16-17: C = clip(Z, -|A|/phi, |A|/phi); A^final = A + eta * sign(A) * C.
    (Stop-gradient is implicit: these are constants to the policy loss.)"""
    a = np.asarray(advantage, dtype=np.float64)
    bound = np.abs(a) / phi
    return a + eta * np.sign(a) * np.clip(z, -bound, bound)


def segment_parent(
    n_tokens: int,
    boundaries: Sequence[int],
    shared: Sequence[float],
    final_parent: Sequence[float],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. 19: non-overlapping credit segments of a parent with nodes b_1 < ... < b_J:
    t < b_1 -> A^shared_1; b_j <= t < b_{j+1} -> (A^final_{j,0} + A^shared_{j+1}) / 2;
    t >= b_J -> A^final_{J,0}."""
    adv = np.empty(n_tokens, dtype=np.float64) if out is None else out
    adv[: boundaries[0]] = shared[0]
    for j in range(len(boundaries) - 1):
        adv[boundaries[j] : boundaries[j + 1]] = 0.5 * (final_parent[j] + shared[j + 1])
    adv[boundaries[-1] :] = final_parent[-1]
    return adv


def centre_root_openings(advantages: Sequence[np.ndarray], kinds: Sequence[str], opening_end: Sequence[int]) -> None:
    """``root_credit=centred`` (ours, issue #36), in place: every root's opening ``[0,
    opening_end)`` less the mean opening credit of the problem's roots. A branch's copied prefix is
    masked, so only roots (parents, fillers) train the tokens all rollouts share, and Eq. 3 over all
    M rollouts makes the roots' base advantages sum to minus the branches': when branches win more
    often than roots, the shared opening gets net negative credit (a parent's A^shared, Eq. 15,
    returns part of it). Centred, the roots' opening credit sums to zero, as Eq. 3 makes it under
    GRPO. A root with an empty opening (a node at its first token) is left out."""
    roots = [k for k, kind in enumerate(kinds) if kind != "branch" and opening_end[k] > 0]
    if roots:
        mean = float(np.mean([advantages[k][0] for k in roots]))
        for k in roots:
            advantages[k][: opening_end[k]] -= mean


def assign_credit(problems: Sequence[ProblemRollouts], cfg: CBPOConfig = CBPOConfig()) -> Credit:
    """Algorithm 1 lines 23-26 for a training batch: base advantages per problem, exact-prefix
    groups, CBV standardised over every node of the batch, CBV-aware continuation advantages,
    masked copied prefixes and segmented parents; parents without nodes and fillers keep their
    base advantage on every token (``root_credit=centred``: :func:`centre_root_openings`)."""
    base = [grpo_advantages(p.rewards, cfg.eps) for p in problems]
    nodes = [
        Node(problem=x, parent=p, at=b, members=members)
        for x, prob in enumerate(problems)
        for p, b, members in exact_prefix_groups(prob.kinds, prob.parent, prob.at)
    ]
    # Eqs. 13, 15-17 for all nodes at once over their flattened members.
    offsets = np.concatenate(([0], np.cumsum([len(p.rewards) for p in problems])))
    members = np.concatenate([n.members + offsets[n.problem] for n in nodes]) if nodes else np.zeros(0, np.int64)
    node_of = np.repeat(np.arange(len(nodes)), [len(n.members) for n in nodes])
    sizes = np.bincount(node_of, minlength=len(nodes))
    rewards = np.concatenate([p.rewards for p in problems])[members]
    member_adv = np.concatenate(base)[members] if base else np.zeros(0)
    cbv = contrastive_branch_value(rewards, node_of)
    z = standardize_cbv(cbv, cfg.eps, cfg.cbv_threshold)
    shared = np.bincount(node_of, member_adv, len(nodes)) / np.maximum(sizes, 1)
    final = modulate(member_adv, z[node_of], cfg.eta, cfg.phi)
    own_nodes: dict[tuple[int, int], list[Node]] = {}  # (problem, parent) -> nodes sorted by b
    branch_value: dict[tuple[int, int], float] = {}  # (problem, branch) -> A^final
    starts = np.concatenate(([0], np.cumsum(sizes)))
    for j, node in enumerate(nodes):
        node.cbv, node.z, node.shared = float(cbv[j]), float(z[j]), float(shared[j])
        node.final = final[starts[j] : starts[j + 1]]
        own_nodes.setdefault((node.problem, node.parent), []).append(node)
        branch_value.update(zip(((node.problem, int(k)) for k in node.members[1:]), node.final[1:].tolist()))

    # One flat buffer for the whole batch (rows are views into it): the token-level fill is
    # memory-bound, and a single allocation keeps it so.
    lengths = np.concatenate([p.n_tokens for p in problems]) if problems else np.zeros(0, np.int64)
    flat_adv = np.empty(int(lengths.sum()), dtype=np.float64)
    flat_mask = np.ones(int(lengths.sum()), dtype=np.int8)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    advantages: list[list[np.ndarray]] = []
    masks: list[list[np.ndarray]] = []
    row = 0
    for x, prob in enumerate(problems):
        adv_x, mask_x = [], []
        for k, kind in enumerate(prob.kinds):
            adv, mask = flat_adv[starts[row] : starts[row + 1]], flat_mask[starts[row] : starts[row + 1]]
            row += 1
            if kind == "branch":
                b = int(prob.at[k])
                adv[:b] = 0.0  # copied prefix: no branch gradient
                mask[:b] = 0
                adv[b:] = branch_value[(x, k)]
            elif (x, k) in own_nodes:
                own = own_nodes[(x, k)]
                segment_parent(len(adv), [nd.at for nd in own], [nd.shared for nd in own], [nd.final[0] for nd in own], out=adv)
            else:
                adv[:] = base[x][k]
            adv_x.append(adv)
            mask_x.append(mask)
        if cfg.root_credit == "centred":
            centre_root_openings(adv_x, prob.kinds, [own_nodes[(x, k)][0].at if (x, k) in own_nodes else len(adv_x[k])
                                                     for k in range(len(prob.kinds))])
        advantages.append(adv_x)
        masks.append(mask_x)
    return Credit(advantages, masks, base, nodes)
