"""AEPO (Dong et al., 2025, "Agentic Entropy-Balanced Policy Optimization", arXiv 2510.14545):
ARPO's successor, balancing entropy in both phases. Rollout: entropy pre-monitoring splits the
budget between global chains and branches, and a branch penalty stops one path from branching at
consecutive high-entropy tool steps. Update: gradients of clipped high-entropy tokens are kept, and
an entropy-aware advantage up-weights uncertain tokens.

[PARTIAL] BASELINES.md section 10, and AEPO's public code (RUC-NLPIR/ARPO ``AEPO/verl_aepo_entropy``,
its ``compute_policy_loss_entropy_balanced_clipping``, read through a fork). Implemented:
- pre-monitoring (the one known equation): m = k sigmoid(beta (H_root - mean H_tool)) global
  chains out of k = budget, rounded and clamped to [global_min, global_max]; H_root is the mean
  entropy of the first step and H_tool of the post-tool steps (ARPO's step entropy, see
  ``baselines.arpo``). The monitoring pass is the first global_min global chains themselves, so no
  slot is spent outside the budget; the other m - global_min are sampled next;
- [APPROX] branch penalty: ARPO's branching from all m chains with
  P = clip(tau + gamma_H dH, 0, 1) (1 - lambda)^l, l = consecutive branching steps on the path
  (a branch inherits its parent's streak, its own fork included); unused slots become fresh
  rollouts (kind "fill");
- [APPROX] entropy-aware advantage: GRPO advantage A_i (soft attribution as ARPO: every model
  token, a copied prefix included) times clip(1 + alpha_H z, 0.5, 1.5), z the token's entropy
  standardised over all loss tokens of the batch (polarity-independent, unlike EAPO). AEPO's code
  takes 1 + 0.2 z unclipped, z over each micro-batch's tokens from the actor's full-vocabulary
  entropy; here the engine's top-K entropy over the step's batch;
- entropy clipping-balanced update (``ENTROPY_BALANCED_CLIP``, a verl policy loss,
  :mod:`baselines.aepo_loss`): PPO's upper clip keeps its value but not its stop-gradient, r sg((1 + eps_high) / r) in
  place of 1 + eps_high, so a token whose ratio passed the bound (typically a high-entropy one)
  still passes gradient (1 + eps_high) A grad log pi; the lower clip and dual-clip are vanilla's.
  As in AEPO's code the bound applies to every token, not only to high-entropy ones.
  Clip bounds 0.2 / 0.28 [APPROX]: AEPO's script values were not read.
The loss is registered with verl by :mod:`baselines.aepo_loss`, the objective's
``policy_loss_module``: the loss (``cbpo.objective.policy_objective``) imports it where it is
computed, and the verl backend has verl import it in every worker process
(``VERL_USE_EXTERNAL_MODULES``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from baselines.agent_steps import fill_to_budget, fresh, step_starts
from baselines.arpo import check_branching, entropy_branching, step_entropy
from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Sampler, TokenCredit, broadcast, register_method
from cbpo.rollout.agent import Job, run_jobs
from cbpo.trajectory import Trajectory

# The update's verl policy loss lives in baselines/aepo_loss.py, imported only where the loss is
# computed: that module imports verl (~5 s), and every `snakemake` plan imports this one.
ENTROPY_BALANCED_CLIP = "aepo_entropy_balanced_clip"  # the verl policy-loss name


@dataclass(frozen=True)
class AEPOConfig(ObjectiveConfig):
    policy_loss: str = ENTROPY_BALANCED_CLIP  # the entropy clipping-balanced update
    policy_loss_module: str | None = "baselines.aepo_loss"  # registers it with verl
    clip_low: float | None = 0.2  # [APPROX] the stand-in's clipping bounds
    clip_high: float | None = 0.28
    budget: int = 16  # k
    # [APPROX] clamp of m (4 and 12 of 16; None: the same quarters of the budget); global_min is
    # also the size of the pre-monitoring pass.
    global_min: int | None = None
    global_max: int | None = None
    sensitivity: float = 1.0  # [APPROX] beta of the pre-monitoring sigmoid
    beam_size: int = 2  # as ARPO
    branch_probability: float = 0.5  # tau, as ARPO
    entropy_weight: float = 0.2  # gamma_H, as ARPO's beta
    branch_penalty: float = 0.5  # [APPROX] lambda
    entropy_tokens: int = 20  # k tokens per step entropy, as ARPO
    top_k: int = 10  # top-K probabilities in each token's entropy (the engine's K)
    advantage_entropy_weight: float = 0.2  # [APPROX] alpha_H
    seed: int = 0  # ours: the branch draws
    eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.global_min is None:
            object.__setattr__(self, "global_min", max(self.budget // 4, 1))
        if self.global_max is None:
            object.__setattr__(self, "global_max", self.budget - self.budget // 4)
        if not 0 < self.global_min <= self.global_max <= self.budget:
            raise ValueError(f"need 0 < global_min <= global_max <= budget, got {self.global_min}, {self.global_max}, {self.budget}")
        if not 0 <= self.branch_penalty <= 1:
            raise ValueError(f"branch_penalty must lie in [0, 1], got {self.branch_penalty}")
        check_branching(self)


def global_samples(group: Sequence[Trajectory], cfg: AEPOConfig, vocab_size: int) -> int:
    """m = k sigmoid(beta (H_root - mean H_tool)) from the pre-monitoring chains, rounded half up
    and clamped; with no tool call to monitor, branching has nowhere to start: global_max."""
    steps = [step_entropy(t, step_starts(t), cfg.entropy_tokens, vocab_size) for t in group]
    tool = np.concatenate([h[1:] for h in steps])
    if tool.size == 0:
        return cfg.global_max
    h_root = float(np.mean([h[0] for h in steps]))
    m = cfg.budget / (1.0 + np.exp(-cfg.sensitivity * (h_root - tool.mean())))
    return int(np.clip(np.floor(m + 0.5), cfg.global_min, cfg.global_max))


def entropy_aware(advantages: Sequence[np.ndarray], entropies: Sequence[np.ndarray], alpha: float, eps: float = 1e-6) -> list[np.ndarray]:
    """A_{i,t} clip(1 + alpha z_{i,t}, 0.5, 1.5), z the token entropy standardised (population
    std) over every token given."""
    flat = np.concatenate(entropies) if entropies else np.zeros(0)
    mean, std = (flat.mean(), flat.std()) if flat.size else (0.0, 0.0)
    return [a * np.clip(1.0 + alpha * (e - mean) / (std + eps), 0.5, 1.5) for a, e in zip(advantages, entropies)]


@register_method("aepo")
class AEPO:
    display_name = "AEPO"
    paper = "Dong et al., 2025, Agentic Entropy-Balanced Policy Optimization, arXiv 2510.14545"
    group = "agentic-rl"
    trains = True
    implemented = ("[PARTIAL] entropy pre-monitoring of global vs branch slots, penalised ARPO branching, entropy-aware "
                   "advantage, gradient-preserving upper clip")
    config = AEPOConfig

    def __init__(self, vocab_size: int, **overrides: Any):
        self.cfg = AEPOConfig.from_overrides(overrides)
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(self.cfg.seed)

    def collect(self, prompts: Sequence[list[int]], sample: Sampler) -> list[list[Trajectory]]:
        return run_jobs([self._rollouts(p) for p in prompts], sample)

    def _rollouts(self, prompt: list[int]) -> Job:
        cfg = self.cfg
        group = yield fresh(prompt, cfg.global_min)
        group += yield fresh(prompt, global_samples(group, cfg, self.vocab_size) - cfg.global_min)
        yield from entropy_branching(group, cfg.budget, self.rng, self.vocab_size, cfg, penalty=cfg.branch_penalty)
        yield from fill_to_budget(group, prompt, cfg.budget)
        return group

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        rows = [broadcast(g, grpo_advantages(np.array([t.reward for t in g], dtype=np.float64), self.cfg.eps)) for g in groups]
        flat = [a for row in rows for a, _ in row]
        scaled = iter(entropy_aware(flat, [t.model_entropies() for g in groups for t in g], self.cfg.advantage_entropy_weight, self.cfg.eps))
        return [[(next(scaled), m) for _, m in row] for row in rows]
