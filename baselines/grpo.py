"""GRPO (Shao et al., 2024, "DeepSeekMath", arXiv 2402.03300): M independent rollouts per
problem, one group-normalised advantage (R - mean) / (std + eps) on every model token (Eq. 3 of
the CBPO paper), PPO-clipped surrogate. The reference point every other method is compared to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import TokenCredit, broadcast, register_method
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class GRPOConfig(ObjectiveConfig):
    budget: int = 16  # rollouts per problem (the paper's shared 16 slots)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")


@register_method("grpo", verl_estimator="grpo")
class GRPO:
    display_name = "GRPO"
    paper = "Shao et al., 2024, DeepSeekMath, arXiv 2402.03300"
    group = "classic-rl"
    trains = True
    implemented = "M independent rollouts; (R - mean) / (std + eps) on every model token; PPO clip, k3 KL"
    config = GRPOConfig  # ``method.*`` settings; the trainer's loss reads ``cfg.objective()``

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor contract; GRPO does not need it.
        self.cfg = self.config.from_overrides(overrides)

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        return [broadcast(g, grpo_advantages(np.array([t.reward for t in g], dtype=np.float64), self.cfg.eps)) for g in groups]
