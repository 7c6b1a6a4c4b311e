"""DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476): GRPO plus four changes, all implemented.

- Clip-Higher (Sec. 3.1): the ratio is clipped to [1 - 0.2, 1 + 0.28] (``clip_low``,
  ``clip_high`` of verl's vanilla loss).
- Dynamic sampling (Sec. 3.2): a group whose M outcome rewards are all equal has no gradient
  and is dropped; batches of the step's size are drawn from the offered prompts until the step
  has as many informative groups as problems, or ``max_num_gen_batches`` batches were drawn.
  A problem offered again in the same step (a pool smaller than the offered prompts) is not
  drawn again, so no problem is trained twice in a step.
  The kept problems have exactly M rollouts each; every rollout drawn and not trained on is
  counted in :meth:`DAPO.step_stats` (``extra_rollouts`` and their tokens and tool calls), so a
  table can show what the matched budget really cost. ``max_num_gen_batches=1`` is the
  budget-matched "filter without resampling" variant; ``filter_groups=false`` turns it off.
- Token-level loss (Sec. 3.3): verl's ``token-mean`` aggregation.
- Overlong reward shaping (Sec. 3.4): the soft length penalty is added to the outcome reward
  before the group normalisation.
No KL term: the paper removes it.

Departures. The length |y| counts every response token, observations included (what fills the
context), and L_max is the agent's ``max_total_tokens`` with the paper's buffer fraction
4096 / 20480. Groups are filtered on the outcome reward before shaping (verl's ``metric=acc``).
verl's recipe draws generation batches of 3x the training batch and stops with an error when
the cap is reached; here each draw is the step's size and a step that reaches the cap trains on
the groups it kept. Clip-Higher binds only with several optimiser steps per rollout batch
(``rl.ppo_mini_batches`` > 1, as the paper preset and verl's recipes): with one, the ratio is 1
where the gradient is taken.

On the verl backend the draw is per problem, not per batch: verl's trainer has a fixed batch,
so each batch row's group is chosen inside the agent loop (``cbpo/backends/verl/agent_loop.py``).
The method is offered the row's problem and ``max_num_gen_batches`` - 1 replacements drawn from
the training rows (by the run's seed, the training step and the row's index), rolls them out one at a time and the
row trains on the first informative group. A row with none trains on the last group drawn (its
advantage zero unless the overlong penalty differs within it, its tokens in token-mean's
denominator) where the local trainer would train on fewer problems; the rollouts drawn and not
trained on are counted under the same keys (``gen_batches`` has no verl counterpart).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Problems, Sampler, TokenCredit, broadcast, extra_stats, register_method, sample_fresh
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class DAPOConfig(ObjectiveConfig):
    budget: int = 16  # rollouts per kept problem (the paper's shared 16 slots)
    eps: float = 1e-6
    filter_groups: bool = True  # dynamic sampling
    max_num_gen_batches: int = 10  # verl's DAPO recipe
    max_response_len: int = 20480  # L_max (the paper: 16384 + 4096)
    overlong_buffer_frac: float = 0.2  # L_cache / L_max = 4096 / 20480
    overlong_penalty: float = 1.0  # penalty factor
    loss_agg_mode: str = "token-mean"  # Sec. 3.3
    clip_low: float | None = 0.2  # Sec. 3.1
    clip_high: float | None = 0.28  # Sec. 3.1
    beta: float = 0.0  # no KL term

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.filter_groups and self.budget < 2:
            raise ValueError("dynamic sampling compares rewards within a group: need budget >= 2")
        if self.max_num_gen_batches < 1:
            raise ValueError(f"max_num_gen_batches must be >= 1, got {self.max_num_gen_batches}")
        if not 0 < self.overlong_buffer_frac <= 1:
            raise ValueError(f"overlong_buffer_frac must lie in (0, 1], got {self.overlong_buffer_frac}")


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: float, factor: float = 1.0) -> np.ndarray:
    """Soft overlong punishment (Sec. 3.4): 0 up to L_max - L_cache, then
    ((L_max - L_cache) - |y|) / L_cache down to -1 at L_max, and -1 beyond; times ``factor``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return factor * np.clip((max_len - buffer - lengths) / buffer, -1.0, 0.0)


def informative(rewards: Sequence[float]) -> bool:
    """Dynamic sampling's keep rule (Sec. 3.2): 0 < #correct < G, i.e. rewards not all equal."""
    return bool(np.ptp(np.asarray(rewards, dtype=np.float64)) > 0)


@register_method("dapo", verl_estimator="grpo")
class DAPO:
    display_name = "DAPO"
    paper = "Yu et al., 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476"
    group = "classic-rl"
    trains = True
    implemented = "GRPO + clip-higher 0.2/0.28, token-mean loss, overlong shaping, dynamic sampling (extra draws counted)"
    config = DAPOConfig

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor; DAPO does not need it.
        self.cfg = DAPOConfig.from_overrides(overrides)
        self._stats: dict[str, float] = {}

    @property
    def prompt_pool(self) -> int:
        return self.cfg.max_num_gen_batches if self.cfg.filter_groups else 1

    def collect(self, prompts: Sequence[list[int]], sample: Sampler, problems: Problems) -> list[list[Trajectory]]:
        """One group per offered prompt: M rollouts for the kept ones, empty for the rest."""
        if len(prompts) % self.prompt_pool:
            raise ValueError(f"DAPO is offered {len(prompts)} prompts, not a multiple of its pool of {self.prompt_pool} batches")
        size = len(prompts) // self.prompt_pool
        out: list[list[Trajectory]] = [[] for _ in prompts]
        drawn: list[Trajectory] = []
        seen: set[tuple[int, ...]] = set()
        kept = batches = gen_batches = 0
        while kept < size and batches < self.prompt_pool:
            # a small pool offers a problem again within one step: it is drawn (and trained) once
            idx = [i for i in range(batches * size, (batches + 1) * size)
                   if tuple(prompts[i]) not in seen and not seen.add(tuple(prompts[i]))]
            batches += 1
            if not idx:
                continue
            groups = sample_fresh([prompts[i] for i in idx], self.cfg.budget, sample)
            problems.score(groups, idx)
            gen_batches += 1
            for i, g in zip(idx, groups):
                drawn += g
                # verl's recipe keeps exactly the batch size: informative groups past it are dropped too.
                if kept < size and (not self.cfg.filter_groups or informative([t.reward for t in g])):
                    out[i] = g
                    kept += 1
        self._stats = {"gen_batches": gen_batches, "kept_groups": kept, **extra_stats(drawn, out)}
        return out

    def step_stats(self) -> dict[str, float]:
        return dict(self._stats)

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        cfg = self.cfg
        out = []
        for g in groups:
            shaped = np.array([t.reward for t in g], dtype=np.float64) + overlong_penalty(
                [len(t.response_ids) for t in g], cfg.max_response_len, cfg.overlong_buffer_frac * cfg.max_response_len, cfg.overlong_penalty
            )
            out.append(broadcast(g, grpo_advantages(shaped, cfg.eps)))
        return out
