"""GiGPO (Feng, Xue, Liu and An, 2025, "Group-in-Group Policy Optimization for LLM Agent
Training", arXiv 2505.10978): GRPO's episode-level group plus step-level groups of actions taken
from the same recurring environment state (an *anchor state*), with no extra rollouts.

Implemented, per step k of rollout i (a model turn, see ``baselines.agent_steps``):
- episode advantage A^E_i = (R_i - mean) / (std + eps) over the problem's M rollouts, one value
  per rollout as in the paper (the verl-agent code weights the statistics by step rows);
- discounted step return R^(i)_k = gamma^(T_i - 1 - k) R_i (outcome reward on the last step only);
- anchor groups: steps of the same problem whose anchor state is identical; A^S = (R_k - mean) /
  (std + eps) within the group, 0 for a singleton;
- A = A^E + omega * A^S on every model token of the step; observations carry no loss.
``mode="mean_norm"`` drops the division by std at both levels (the code's other mode).

Departures. [PARTIAL] anchors for open-ended tools: the anchor state of step k >= 1 is the exact
token sequence of the tool observation that precedes it, of step 0 the prompt (every rollout of
the problem shares it), as BASELINES.md section 7 proposes; exact repeats after step 0 are rare in
open-ended Python/search, so GiGPO then degrades towards GRPO with a step-0 length preference,
which is honest baseline behaviour. The fuzzy-anchor variants of later verl-agent versions and the
ALFWorld invalid-action penalty are not used. Budget: M = 16 independent rollouts, as GRPO.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from baselines.agent_steps import grouped_advantages, observation_before, step_starts
from cbpo.objective import ObjectiveConfig
from cbpo.registry import TokenCredit, register_method
from cbpo.trajectory import Trajectory

MODES = ("mean_std_norm", "mean_norm")


@dataclass(frozen=True)
class GiGPOConfig(ObjectiveConfig):
    budget: int = 16  # M independent rollouts per problem (the paper's group size is 8; 16 is the suite's)
    gamma: float = 0.95  # step-return discount
    step_advantage_w: float = 1.0  # omega, weight of the step-level advantage
    mode: str = "mean_std_norm"  # normalisation at both levels (BASELINES.md section 7)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")


def step_rows(group: Sequence[Trajectory], gamma: float) -> tuple[list[tuple[int, int]], list[tuple], np.ndarray]:
    """Every step of every rollout as (rollout, step), with its anchor state and discounted return."""
    rows, anchors, returns = [], [], []
    for i, t in enumerate(group):
        starts = step_starts(t)
        for k, b in enumerate(starts):
            rows.append((i, k))
            anchors.append(observation_before(t, int(b)) if k else ())
            returns.append(gamma ** (len(starts) - 1 - k) * t.reward)
    return rows, anchors, np.asarray(returns, dtype=np.float64)


def gigpo_advantages(group: Sequence[Trajectory], cfg: GiGPOConfig) -> list[np.ndarray]:
    """A^E + omega * A^S per model token of each rollout of one problem."""
    std = cfg.mode == "mean_std_norm"
    episode = grouped_advantages([t.reward for t in group], [0] * len(group), cfg.eps, std)
    rows, anchors, returns = step_rows(group, cfg.gamma)
    step = grouped_advantages(returns, anchors, cfg.eps, std)
    out = [np.full(t.n_model_tokens, episode[i]) for i, t in enumerate(group)]
    for (i, k), a in zip(rows, step):
        starts = step_starts(group[i])
        end = starts[k + 1] if k + 1 < len(starts) else None
        out[i][starts[k] : end] += cfg.step_advantage_w * a
    return out


@register_method("gigpo")
class GiGPO:
    display_name = "GIGPO"  # as Table 1 of the CBPO paper prints it
    paper = "Feng et al., 2025, Group-in-Group Policy Optimization for LLM Agent Training, arXiv 2505.10978"
    group = "agentic-rl"
    trains = True
    implemented = "episode GRPO advantage + omega x step advantage over anchor states (the preceding tool observation)"
    config = GiGPOConfig

    def __init__(self, vocab_size: int, **overrides: Any):
        # vocab_size is part of every method's constructor; GiGPO's anchors do not need it.
        self.cfg = GiGPOConfig.from_overrides(overrides)

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        return [
            [(a, np.ones(t.n_model_tokens, dtype=np.int8)) for t, a in zip(group, gigpo_advantages(group, self.cfg))]
            for group in groups
        ]
