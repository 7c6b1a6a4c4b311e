"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv 2507.18071): the
importance ratio and the clipping move from tokens to whole sequences.

Implemented: M = 16 independent rollouts with GRPO's group-normalised advantage (Eq. 3 of the
CBPO paper); the loss is verl's ``gspo`` policy loss, the GSPO-token form of Sec. 4.3 whose value
is the sequence ratio s_i = exp((1/|y_i|) sum_t log(pi_theta / pi_old)), clipped to
[1 - 3e-4, 1 + 4e-4] (Sec. 5.1) and aggregated as a sequence mean of token means; no KL term.
|y_i| counts model tokens only: observation tokens carry no loss.

Departures: the clip range binds only with several optimiser steps per rollout batch (GSPO splits
each batch into 4 mini-batches: ``rl.ppo_mini_batches=4``, the paper preset's value); with one,
s_i is 1 where the gradient is taken. verl clamps the log-ratio at 10.
"""
from __future__ import annotations

from dataclasses import dataclass

from baselines.grpo import GRPO, GRPOConfig
from cbpo.registry import register_method


@dataclass(frozen=True)
class GSPOConfig(GRPOConfig):
    policy_loss: str = "gspo"
    clip_low: float | None = 3e-4  # Sec. 5.1
    clip_high: float | None = 4e-4  # Sec. 5.1
    beta: float = 0.0  # GSPO trains without a KL term


@register_method("gspo", verl_estimator="grpo")
class GSPO(GRPO):
    """GRPO's rollouts and advantages; only the objective (``GSPOConfig``) differs."""

    display_name = "GSPO"
    paper = "Zheng et al., 2025, Group Sequence Policy Optimization, arXiv 2507.18071"
    implemented = "GRPO advantages; sequence-level (length-normalised) ratio clipped to [1-3e-4, 1+4e-4] (verl loss_mode=gspo)"
    config = GSPOConfig
