"""The CBPO objective (Eqs. 20-23): GRPO's token-level clipped surrogate on segmented token
advantages, token mean per sequence over loss-masked tokens, mean over rollouts, minus
beta * KL(pi_theta || pi_ref).

The PPO clipping, KL estimators and loss aggregation are verl's ``core_algos`` (the code the
paper's verl-based training runs), not re-derived here.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

# Eq. 23: (1/M) sum_k (1/|y_k|) sum_t (...) is verl's "seq-mean-token-mean".
LOSS_AGG_MODE = "seq-mean-token-mean"


@lru_cache(maxsize=None)
def _actor_config(clip_eps: float, clip_low: float | None, clip_high: float | None):
    from verl.workers.config.actor import ActorConfig

    # verl's vanilla loss also applies dual-clip PPO (ratio bound c) on negative advantages;
    # Eq. 22 is the plain clipped surrogate, so c is set out of reach.
    return ActorConfig(
        strategy="fsdp",
        clip_ratio=clip_eps,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=1e9,
        rollout_n=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=LOSS_AGG_MODE,
    )


def policy_objective(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    beta: float = 0.001,
    kl_estimator: str = "low_var_kl",
    policy_loss: str = "vanilla",
    clip_low: float | None = None,
    clip_high: float | None = None,
    loss_agg_mode: str = LOSS_AGG_MODE,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Loss to minimise, i.e. -J_CBPO (Eq. 23), for (batch, response_len) tensors.

    ``loss_mask`` is 1 on model tokens that receive gradient (observation tokens and copied
    branch prefixes are 0). ``policy_loss`` names a verl policy loss ("vanilla" is Eqs. 20-22;
    "gspo" etc. serve the baselines); ``clip_low``/``clip_high`` allow asymmetric clipping.
    """
    from verl.trainer.ppo import core_algos

    mask = loss_mask.to(log_prob.dtype)
    config = _actor_config(clip_eps, clip_low, clip_high)
    loss_fn = core_algos.get_policy_loss_fn(policy_loss)
    pg_loss, metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
    )
    loss = pg_loss
    metrics = {k.split("/")[-1]: v for k, v in metrics.items()}
    metrics["pg_loss"] = pg_loss.detach().item()
    if ref_log_prob is not None and beta > 0:
        kl = core_algos.kl_penalty(log_prob, ref_log_prob, kl_estimator)
        kl_loss = core_algos.agg_loss(kl, mask, loss_agg_mode)
        loss = loss + beta * kl_loss
        metrics["kl"] = kl_loss.detach().item()
    return loss, metrics
