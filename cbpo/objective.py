"""The CBPO objective (Eqs. 20-23): GRPO's token-level clipped surrogate on segmented token
advantages, token mean per sequence over loss-masked tokens, mean over rollouts, minus
beta * KL(pi_theta || pi_ref).

The PPO clipping, KL estimators and loss aggregation are verl's ``core_algos`` (the code the
paper's verl-based training runs), not re-derived here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeVar

import numpy as np

if TYPE_CHECKING:  # method configs extend ObjectiveConfig: importing them needs no torch
    import torch

# Eq. 23: (1/M) sum_k (1/|y_k|) sum_t (...) is verl's "seq-mean-token-mean".
LOSS_AGG_MODE = "seq-mean-token-mean"
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

Config = TypeVar("Config", bound="ObjectiveConfig")


@dataclass(frozen=True)
class ObjectiveConfig:
    """How a method's token advantages become a loss (Eqs. 20-23). Every method's config
    extends this, so ``method.<knob>`` is the one place each knob is set. The paper gives no
    clip range, KL weight or estimator: ours, following verl's GRPO recipe.

    Subclasses call ``super().__post_init__()`` and, like it, start each error message with
    the field's name: the entry points prefix it with ``method.``."""

    policy_loss: str = "vanilla"  # a verl policy-loss name ("vanilla" = PPO clip, Eqs. 20-22)
    # the module that registers policy_loss with verl (core_algos.register_policy_loss) when verl
    # does not ship it: imported where the loss is computed, in this process and in verl's workers
    policy_loss_module: str | None = None
    loss_agg_mode: str = LOSS_AGG_MODE  # Eq. 23's sequence mean of token means
    clip_eps: float = 0.2  # ours: PPO clip range epsilon
    clip_low: float | None = None  # asymmetric clipping (DAPO's clip-higher); None = clip_eps
    clip_high: float | None = None
    beta: float = 0.001  # ours: KL weight; 0 drops the reference model
    kl_estimator: str = "low_var_kl"  # ours: k3, as verl's GRPO recipe

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        for name in ("clip_eps", "clip_low", "clip_high"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")

    @classmethod
    def from_overrides(cls: type[Config], overrides: Mapping[str, Any] | None = None, base: Config | None = None) -> Config:
        """``base`` (default: the defaults) with ``overrides`` applied, naming any unknown key."""
        overrides = dict(overrides or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        # without a base, build from scratch so defaults derived in __post_init__ follow the overrides
        return cls(**overrides) if base is None else replace(base, **overrides)

    def objective(self) -> "ObjectiveConfig":
        """The objective part of a method config that extends this class."""
        return ObjectiveConfig(**{f.name: getattr(self, f.name) for f in fields(ObjectiveConfig)})


# verl's vanilla loss also applies dual-clip PPO (bound c on the ratio) to negative advantages,
# with c = 3 unless set; Eq. 22 is the plain clipped surrogate, so both backends set c out of reach.
DUAL_CLIP_OFF = 1e9


def clip_ratios(objective: ObjectiveConfig) -> dict[str, float]:
    """The objective's PPO clip range under verl's actor names, the one mapping both backends
    use (the local loss here, the verl actor in ``cbpo/backends/verl/config.py``)."""
    low, high = (objective.clip_eps if x is None else x for x in (objective.clip_low, objective.clip_high))
    return {"clip_ratio": objective.clip_eps, "clip_ratio_low": low, "clip_ratio_high": high}


def _actor_config(objective: ObjectiveConfig, global_batch_info: Mapping[str, Any]):
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        **clip_ratios(objective),
        clip_ratio_c=DUAL_CLIP_OFF,
        rollout_n=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=objective.loss_agg_mode,
        global_batch_info=dict(global_batch_info),
    )


def policy_objective(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    objective: ObjectiveConfig = ObjectiveConfig(),
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: int | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Loss to minimise, i.e. -J_CBPO (Eq. 23), for (batch, response_len) tensors.

    ``loss_mask`` is 1 on model tokens that receive gradient (observation tokens and copied
    branch prefixes are 0). ``objective`` names the verl policy loss ("vanilla" is Eqs. 20-22;
    "gspo" etc. serve the baselines), the clip range, the KL term and the aggregation.

    For a micro-batch of a larger batch, ``batch_num_tokens`` (loss tokens), ``global_batch_size``
    (rollouts, those without a loss token included) and ``loss_scale_factor`` (the response
    budget) describe the whole batch, as verl's ``agg_loss`` takes them (:func:`loss_normalisers`):
    the micro-batches' losses then add up to the whole batch's for every ``loss_agg_mode``. Left
    as None, the tensors are the batch (verl's defaults: rows with a loss token, padded width).
    """
    from verl.trainer.ppo import core_algos

    if objective.policy_loss_module:
        importlib.import_module(objective.policy_loss_module)
    mask = loss_mask.to(log_prob.dtype)
    batch_info = {"batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size,
                  "loss_scale_factor": loss_scale_factor}
    loss_fn = core_algos.get_policy_loss_fn(objective.policy_loss)
    pg_loss, metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=objective.loss_agg_mode,
        config=_actor_config(objective, batch_info),
    )
    loss = pg_loss
    metrics = {k.split("/")[-1]: v for k, v in metrics.items()}
    metrics["pg_loss"] = pg_loss.detach().item()
    if ref_log_prob is not None and objective.beta > 0:
        kl = core_algos.kl_penalty(log_prob, ref_log_prob, objective.kl_estimator)
        kl_loss = core_algos.agg_loss(kl, mask, objective.loss_agg_mode, **batch_info)
        loss = loss + objective.beta * kl_loss
        metrics["kl"] = kl_loss.detach().item()
    return loss, metrics


def loss_normalisers(credits, rows: Sequence[int], response_budget: int) -> dict[str, int]:
    """verl's ``agg_loss`` arguments for the mini-batch ``rows``, as verl's actor takes them: its
    loss tokens; its rollouts, all of them (Eq. 23's 1/M over the group's M rollouts: a CBPO
    branch with no tokens of its own, a rollout with no model token, counts, as in verl's
    ``ppo_mini_batch_size x rollout.n``); and seq-mean-token-sum-norm's constant, the response
    budget (verl's ``actor.loss_scale_factor``, which the verl backend sets to the same)."""
    return {"batch_num_tokens": int(sum(np.count_nonzero(credits[i][1]) for i in rows)),
            "global_batch_size": len(rows), "loss_scale_factor": int(response_budget)}
