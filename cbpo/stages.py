"""The training stages' settings, ``sft.*`` and ``rl.*`` (cbpo.schema makes them the config's
schema), which both backends train by. Free of torch, so the Snakefile's parse does not load it.
Error messages start with the field's name; the entry points prefix it with ``sft.`` or ``rl.``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cbpo.rollout.agent import AgentConfig


@dataclass
class SFTConfig:
    steps: int = 250
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    decay: str = "constant"  # after warm-up: "constant" or "cosine" (to min_lr_ratio * lr)
    min_lr_ratio: float = 0.0
    micro_batches: int = 1  # the batch, sorted by length, in this many chunks: less padding, same loss
    max_len: int = 512
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "micro_batches", "max_len", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "weight_decay", "warmup_steps"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.decay not in ("constant", "cosine"):
            raise ValueError(f"decay must be 'constant' or 'cosine', got {self.decay!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


ASYNC_TRAINING = ("none", "one_step_off")


@dataclass
class RLConfig:
    """The loop's settings. The objective's (clip range, KL weight and estimator, loss
    aggregation) and the entropy's top-K are the method's: ``method.*``."""

    steps: int = 50
    problems_per_step: int = 8  # prompts per step; each gets the method's M rollout slots
    pool_size: int | None = None  # RL problems: every training row, or a domain-balanced subset this big
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 32  # sequences per forward/backward (memory only, not the maths)
    # Optimiser steps per rollout batch, each on a disjoint mini-batch, all against pi_old (the
    # sampling policy): verl's ppo_mini_batch_size schedule. With 1 the ratio is 1 where the
    # gradient is taken, so clip ranges (DAPO's clip-higher, GSPO's) never bind.
    ppo_mini_batches: int = 1
    # Ours (PrefixGrouper, arXiv 2506.05433): the update runs a micro-batch's rows with one prompt
    # as one prefix tree, each shared prefix (the prompt, a branch's copied prefix) once in the
    # forward and backward, where that costs fewer operations than one padded row each (False:
    # always padded rows); the same log-probs and gradient either way (cbpo/logprobs.py).
    shared_prefix: bool = True
    temperature: float = 1.0  # ours: the paper gives no rollout temperature
    seed: int = 0
    checkpoint_every: int = 10
    dump_rollouts: bool = False
    dump_every: int = 1  # with dump_rollouts: every k-th step's rollouts, and the last step's
    engine: str = "hf"  # rollouts: "hf" (the policy itself, on its device) or "vllm" (weights pushed each step)
    vllm_gpu_memory: float = 0.3  # vLLM's share of the GPU; the policy, its optimiser and the reference use the rest
    # With engine=vllm: rows join vLLM's running batch as soon as they are ready ("stream"), or
    # every waiting row is sampled to its stop in one round first ("rounds"; cbpo/rollout/vllm_engine.py).
    vllm_admission: str = "stream"
    # backend=verl only: "one_step_off" trains on verl's one-step-off-policy trainer, which
    # generates step s+1's batch (on vLLM servers of their own, verl.async_rollout_gpus per node)
    # while the actor trains on step s's; "none": verl's synchronous trainer, as the local one.
    # None by default: its speed-up is verl's measurement on GPUs, not ours (docs/engines.md).
    # (Named after verl's async_training section: `async` itself is a Python keyword; "none",
    # not "off", which YAML reads as false.)
    async_training: str = "none"
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "problems_per_step", "micro_batch_size", "checkpoint_every", "ppo_mini_batches", "dump_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "weight_decay", "temperature"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be 'hf' or 'vllm', got {self.engine!r}")
        if self.vllm_admission not in ("stream", "rounds"):
            raise ValueError(f"vllm_admission must be 'stream' or 'rounds', got {self.vllm_admission!r}")
        if self.async_training not in ASYNC_TRAINING:
            raise ValueError(f"async_training must be one of {ASYNC_TRAINING}, got {self.async_training!r}")
        if not 0 < self.vllm_gpu_memory < 1:
            raise ValueError(f"vllm_gpu_memory must lie in (0, 1), got {self.vllm_gpu_memory}")
