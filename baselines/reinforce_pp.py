"""REINFORCE++ (Hu et al., 2025, "REINFORCE++: Stabilizing Critic-Free Policy Optimization with
Global Advantage Normalization", arXiv 2501.03262).

``reinforce_pp`` is plain REINFORCE++, the row Table 1 names (paper Sec. 3): a k1 KL penalty in
the token reward, KL_t = log pi_old(y_t) - log pi_ref(y_t), r_t = 1[t = last] R - beta KL_t,
gamma = 1, so A_t = R - beta sum_{s >= t} KL_s; whitened over every model token of the batch
(global normalisation, no per-prompt baseline); PPO clip 0.2 and no separate KL loss. The
returns and the whitening are verl's ``compute_reinforce_plus_plus_outcome_advantage``, called
here on the rollouts' model tokens. beta = 1e-3 (verl's REINFORCE++ example, ``kl_ctrl.kl_coef``).
The trainer hands each rollout its KL_t (``Trajectory.ref_kl``, ``registry.reward_kl``): the
local trainer from one pass of the policy and the reference model, verl from its batch's
``old_log_probs`` and ``ref_log_prob`` (``algorithm.use_kl_in_reward``).

``baseline=true`` is REINFORCE++-baseline, the paper's variant for several responses per prompt
(``variants.reinforce_pp-baseline`` in workflow/config.yaml): each reward minus its group's mean,
A_i = R_i - mean_G (no division by the group std), broadcast to the rollout's model tokens, then
whitened over every model token of the batch (verl's
``compute_reinforce_plus_plus_baseline_outcome_advantage``); the variant puts its KL in a k2 loss
of weight 1e-3 instead (OpenRLHF's ``reinforce_baseline`` recipes; verl's ``kl_loss_type=mse``), as
BASELINES.md recommends.

Multi-turn rollouts: observation tokens carry no reward and no KL, and the return runs over the
model tokens only, so every turn sees the outcome reward (verl 0.9.1 carries the return through
observation tokens the same way). A batch with fewer than two model tokens has no variance to
whiten by and gets advantage 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cbpo.objective import ObjectiveConfig
from cbpo.registry import TokenCredit, register_method
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class ReinforcePPConfig(ObjectiveConfig):
    budget: int = 16  # rollouts per problem (the paper's shared 16 slots)
    baseline: bool = False  # True: REINFORCE++-baseline (group mean subtracted), a variant
    kl_coef: float = 0.001  # beta of the k1 KL in the token reward (verl's REINFORCE++ example)
    beta: float = 0.0  # no KL loss: plain REINFORCE++ has its KL in the reward
    kl_estimator: str = "mse"  # the KL loss's estimator where beta > 0 (the -baseline variant: k2)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


def reinforce_pp_advantages(rewards: Sequence[Sequence[float]], kls: Sequence[Sequence[np.ndarray]],
                            kl_coef: float, baseline: bool = False) -> list[list[np.ndarray]]:
    """REINFORCE++ (or, with ``baseline``, REINFORCE++-baseline) over a batch of groups: each
    rollout's advantage on each of its model tokens. ``rewards[g][i]`` is rollout i of group g's
    outcome reward, ``kls[g][i]`` its KL_t on its model tokens (zeros where ``kl_coef`` is 0)."""
    import torch  # with verl's, on use: the Snakefile loads every method's module
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import (compute_reinforce_plus_plus_baseline_outcome_advantage,
                                             compute_reinforce_plus_plus_outcome_advantage)

    flat_r = [r for g in rewards for r in g]
    flat_kl = [np.asarray(k, dtype=np.float64) for g in kls for k in g]
    lengths = np.array([len(k) for k in flat_kl], dtype=np.int64)
    out = [np.zeros(n) for n in lengths]
    if lengths.sum() >= 2:
        width = int(lengths.max())
        mask = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None]).double()
        token_rewards = torch.zeros((len(flat_r), width), dtype=torch.float64)
        for i, (r, k) in enumerate(zip(flat_r, flat_kl)):
            if len(k):
                token_rewards[i, : len(k)] = torch.from_numpy(-kl_coef * k)
                token_rewards[i, len(k) - 1] += r
        if baseline:
            index = np.array([g for g, group in enumerate(rewards) for _ in group])
            adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards, mask, index)
        else:
            adv, _ = compute_reinforce_plus_plus_outcome_advantage(token_rewards, mask, AlgoConfig(gamma=1.0))
        out = [adv[i, :n].numpy() for i, n in enumerate(lengths)]
    bounds = np.cumsum([0, *(len(g) for g in rewards)])
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@register_method("reinforce_pp", verl_estimator=lambda cfg: "reinforce_plus_plus_baseline" if cfg.baseline
                 else "reinforce_plus_plus")
class ReinforcePP:
    display_name = "REINFORCE++"
    paper = "Hu et al., 2025, REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage Normalization, arXiv 2501.03262"
    group = "classic-rl"
    trains = True
    implemented = ("REINFORCE++: k1 KL in the token reward (beta 1e-3), gamma 1, returns whitened over the batch's model "
                   "tokens, PPO clip; baseline=true: REINFORCE++-baseline (group mean, k2 KL loss)")
    config = ReinforcePPConfig

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor; REINFORCE++ does not need it.
        self.cfg = ReinforcePPConfig.from_overrides(overrides)

    @property
    def reward_kl(self) -> float:
        """beta of the KL in the token reward: the trainer fills ``Trajectory.ref_kl`` where > 0."""
        return self.cfg.kl_coef

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        kls = [[t.model_ref_kl() if self.cfg.kl_coef else np.zeros(t.n_model_tokens) for t in g] for g in groups]
        adv = reinforce_pp_advantages([[t.reward for t in g] for g in groups], kls, self.cfg.kl_coef, self.cfg.baseline)
        return [[(a, np.ones(len(a), dtype=np.int8)) for a in g] for g in adv]
