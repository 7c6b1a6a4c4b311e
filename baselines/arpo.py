"""ARPO (Dong et al., 2025, "Agentic Reinforced Policy Optimization", ICLR 2026, arXiv
2507.19849): token entropy rises right after tool results, so ARPO starts N global chains and
spends the rest of the budget on partial rollouts branched at tool-call steps where entropy rose;
training is GRPO with soft advantage attribution.

Implemented (official code, RUC-NLPIR/ARPO ``vllm_rollout_with_tools.py``):
- step entropy H = sum over the first min(k, length) model tokens of a step of the top-K entropy,
  divided by log|V| (a sum, not a mean, as the code); H_init = the rollout's first step, for a
  branch its first step after the branch point;
- at each tool boundary b of a rollout (its own, after its branch point), with
  dH = H(step that ended in the call) - H_init, up to beam_size - 1 branches are drawn, each with
  probability P = clip(tau + beta dH, 0, 1) while the problem has slots left; a branch keeps the
  exact prefix through the tool result (tokens, masks, tool-call count: ``baselines.agent_steps.fork``)
  and resamples from b; branches branch in turn;
- slots left when no rollout can branch are spent on fresh complete rollouts (kind "fill");
- credit: soft attribution, the code's default: every rollout is a full sequence with its own
  GRPO advantage on all its model tokens, a copied prefix included (identical ratios on shared
  tokens make the gradient average the sharers' advantages). Hard attribution is not implemented.

Departures. The code decides inside its generation loop, all rollouts of a batch in lockstep; here
``sample`` runs rollouts to the end, so the decisions are replayed after each phase of a problem
from the recorded entropies, in tool-step order across the phase's rollouts (the same decisions;
only which rollout gets the last slots can differ, since a branch decides in the next phase). A
problem's next phase starts as soon as its own rollouts are done, in the running batch. Fresh
rollouts that fill the budget do not branch (the code lets a fresh chain branch). The code's
``initial_entropy_dict`` is never reset between batches; here H_init is per rollout, the paper's
intent. ARPO's reward (format penalty, F1, tool bonus) is replaced by the suite's [0, 1] reward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from baselines.agent_steps import fill_to_budget, fork, fresh, step_starts
from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Sampler, TokenCredit, broadcast, register_method
from cbpo.rollout.agent import Job, run_jobs
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class ARPOConfig(ObjectiveConfig):
    budget: int = 16  # M = rollout.n
    initial_rollouts: int | None = None  # N global chains; None: half the budget (the paper's 8 of 16)
    beam_size: int = 2  # at most beam_size - 1 branches per rollout and tool step
    branch_probability: float = 0.5  # tau
    entropy_weight: float = 0.2  # beta
    entropy_tokens: int = 20  # k, tokens of a step in its entropy
    top_k: int = 10  # top-K probabilities in each token's entropy (the engine's K)
    seed: int = 0  # ours: the branch draws
    eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.initial_rollouts is None:
            object.__setattr__(self, "initial_rollouts", max(self.budget // 2, 1))
        if not 0 < self.initial_rollouts <= self.budget:
            raise ValueError(f"need 0 < initial_rollouts <= budget, got {self.initial_rollouts}, {self.budget}")
        check_branching(self)


def check_branching(cfg) -> None:
    """Ranges of the knobs ARPO and AEPO share."""
    if cfg.beam_size < 1 or cfg.entropy_tokens < 1 or cfg.top_k < 1:
        raise ValueError("beam_size, entropy_tokens and top_k must be >= 1")
    if not 0 <= cfg.branch_probability <= 1:
        raise ValueError(f"branch_probability must lie in [0, 1], got {cfg.branch_probability}")


def step_entropy(t: Trajectory, starts: np.ndarray, tokens: int, vocab_size: int) -> np.ndarray:
    """ARPO's entropy of each step starting at ``starts``: the summed top-K entropy of its first
    min(tokens, length) model tokens over log|V|."""
    ent = t.model_entropies()
    ends = np.append(starts[1:], len(ent))
    return np.array([ent[s : min(s + tokens, e)].sum() for s, e in zip(starts, ends)]) / np.log(vocab_size)


def decision_points(t: Trajectory, tokens: int, vocab_size: int) -> list[tuple[int, float]]:
    """(b, dH) at each tool boundary of ``t`` after its branch point, in order: dH is the entropy
    of the step that ended in the call minus that of ``t``'s first own step."""
    starts = step_starts(t)
    starts = starts[starts >= (t.at or 0)]
    h = step_entropy(t, starts, tokens, vocab_size)
    return [(int(b), float(h[j - 1] - h[0])) for j, b in enumerate(starts) if j >= 1]


def branch_probability(delta_h: float, tau: float, beta: float, penalty: float = 0.0, streak: int = 0) -> float:
    """ARPO: P = clip(tau + beta dH, 0, 1). AEPO's branch penalty [APPROX] multiplies by
    (1 - penalty)^streak, streak = consecutive branching steps already taken on the path."""
    return float(np.clip(tau + beta * delta_h, 0.0, 1.0)) * (1.0 - penalty) ** streak


def entropy_branching(
    group: list[Trajectory],
    budget: int,
    rng: np.random.Generator,
    vocab_size: int,
    cfg,
    penalty: float = 0.0,
) -> Job:
    """Spend one problem's slots on entropy-driven branches of its rollouts, phase by phase
    (each phase's forks sampled together, a step of the problem's job), until no rollout
    branches or no slot is left. ``cfg`` is ARPO's or AEPO's config (beam_size,
    branch_probability, entropy_weight, entropy_tokens); ``penalty`` is AEPO's lambda (0 for
    ARPO)."""
    frontier = list(range(len(group)))
    inherited = dict.fromkeys(frontier, 0)  # the branch streak each rollout starts with
    while frontier:
        left = budget - len(group)
        points = {k: decision_points(group[k], cfg.entropy_tokens, vocab_size) for k in frontier}
        streak = dict(inherited)
        requests, child_streak = [], []
        for r in range(max(map(len, points.values()), default=0)):
            for k in frontier:
                if r >= len(points[k]):
                    continue
                b, dh = points[k][r]
                p = branch_probability(dh, cfg.branch_probability, cfg.entropy_weight, penalty, streak[k])
                n = 0
                for _ in range(cfg.beam_size - 1):
                    if left > 0 and rng.random() < p:
                        requests.append(fork(group[k], b, k))
                        left -= 1
                        n += 1
                streak[k] = streak[k] + 1 if n else 0
                child_streak += [streak[k]] * n
        start = len(group)
        group += yield requests
        frontier = list(range(start, len(group)))
        inherited = dict(zip(frontier, child_streak))


@register_method("arpo")
class ARPO:
    display_name = "ARPO"
    paper = "Dong et al., 2025, Agentic Reinforced Policy Optimization (ICLR 2026), arXiv 2507.19849"
    group = "agentic-rl"
    trains = True
    implemented = "N global chains + entropy-triggered branches after tool results (exact prefixes); GRPO, soft attribution"
    config = ARPOConfig

    def __init__(self, vocab_size: int, **overrides: Any):
        self.cfg = ARPOConfig.from_overrides(overrides)
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(self.cfg.seed)

    def collect(self, prompts: Sequence[list[int]], sample: Sampler) -> list[list[Trajectory]]:
        return run_jobs([self._rollouts(p) for p in prompts], sample)

    def _rollouts(self, prompt: list[int]) -> Job:
        group = yield fresh(prompt, self.cfg.initial_rollouts)
        yield from entropy_branching(group, self.cfg.budget, self.rng, self.vocab_size, self.cfg)
        yield from fill_to_budget(group, prompt, self.cfg.budget)
        return group

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        return [broadcast(g, grpo_advantages(np.array([t.reward for t in g], dtype=np.float64), self.cfg.eps)) for g in groups]
