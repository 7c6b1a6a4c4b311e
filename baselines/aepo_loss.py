"""AEPO's entropy clipping-balanced update as a verl policy loss (Dong et al., 2025, arXiv
2510.14545; the method is :mod:`baselines.aepo`). Importing this module registers it under
``ENTROPY_BALANCED_CLIP``: AEPO imports it when built, and verl's worker processes through
``VERL_USE_EXTERNAL_MODULES=baselines.aepo_loss`` (cbpo/backends/verl/launch.py). Kept apart from
the method because it imports verl, which every `snakemake` plan would otherwise pay for."""
from __future__ import annotations

import logging

import torch

from baselines.aepo import ENTROPY_BALANCED_CLIP

# verl's first import calls logging.basicConfig: a program that builds AEPO would print each of
# its own log records twice
_root_handlers = logging.root.handlers[:]
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import torch_functional as verl_F  # noqa: E402

logging.root.handlers[:] = _root_handlers


@core_algos.register_policy_loss(ENTROPY_BALANCED_CLIP)
def entropy_balanced_clip_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                               response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                               rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """verl's vanilla PPO loss (same value, dual-clip included) with a gradient-preserving upper
    clip: above 1 + eps_high the ratio becomes r * sg((1 + eps_high) / r)."""
    eps = config.clip_ratio
    low = eps if config.clip_ratio_low is None else config.clip_ratio_low
    high = eps if config.clip_ratio_high is None else config.clip_ratio_high
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # as vanilla
    ratio = torch.exp(log_ratio)
    bounded = torch.where(ratio > 1 + high, ratio * ((1 + high) / ratio).detach(), torch.clamp(ratio, min=1 - low))
    unclipped, clipped = -advantages * ratio, -advantages * bounded
    surrogate = torch.maximum(unclipped, clipped)
    dual = torch.minimum(surrogate, -advantages * config.clip_ratio_c)
    losses = torch.where(advantages < 0, dual, surrogate)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = core_algos.agg_loss(loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                               **config.global_batch_info)
    metrics = {
        "actor/pg_clipfrac": verl_F.masked_mean((clipped > unclipped).float(), response_mask).item(),
        "actor/ppo_kl": verl_F.masked_mean(-log_ratio, response_mask).item(),
        "actor/pg_clipfrac_lower": verl_F.masked_mean(((surrogate > dual) & (advantages < 0)).float(), response_mask).item(),
    }
    return loss, metrics
