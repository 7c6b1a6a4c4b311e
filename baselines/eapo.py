"""EAPO (He et al., 2026, "Rethinking Token-Level Credit Assignment in RLVR: A Polarity-Entropy
Analysis", arXiv 2604.11056): a token's credit is bounded by its entropy, so GRPO's uniform
broadcast is modulated per token by entropy, with two hyperparameters alpha and phi.

Implemented (BASELINES.md section 5): GRPO's group-normalised advantage A_i, then per model token
the bounded modulation that the CBPO paper's Eqs. 16-17 say they follow (He et al.), with the
batch-standardised token entropy Z_H in place of CBPO's standardised CBV:
    Z_H = (H_{i,t} - mean_B H) / (std_B H + eps),
    A_{i,t} = A_i + alpha * sign(A_i) * clip(Z_H, -|A_i| / phi, |A_i| / phi)
(``cbpo.credit.modulate``, the function CBPO's Eq. 17 uses), mean and std over every model token
of the step's batch. High-entropy tokens get more credit of their polarity, low-entropy ones
less; the change is at most alpha / phi of |A_i|, so no token's sign flips (alpha < phi).
A batch of constant entropy keeps GRPO's advantages.

[APPROX] The paper's alpha and phi values are not public (abstracts and summaries only; no
code): ours are CBPO's eta and phi (0.2, 2.0), the same bound on the relative modulation. H is
the engine's truncated top-K entropy of pi_old (Eq. 6 of the CBPO paper, K = ``rl.top_k_entropy``),
not the full-vocabulary entropy; the statistics are the step's batch's, not per mini-batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cbpo.credit import grpo_advantages, modulate
from cbpo.objective import ObjectiveConfig
from cbpo.registry import TokenCredit, register_method
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class EAPOConfig(ObjectiveConfig):
    budget: int = 16  # rollouts per problem (the paper's shared 16 slots)
    eps: float = 1e-6
    alpha: float = 0.2  # [APPROX] modulation strength (CBPO's eta)
    phi: float = 2.0  # [APPROX] bound on the relative modulation, |change| <= alpha |A| / phi (CBPO's phi)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.alpha < self.phi:
            raise ValueError(f"alpha must satisfy 0 <= alpha < phi so that no sign flips, got alpha={self.alpha}, phi={self.phi}")


def entropy_z(entropy: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Z_H: a batch's token entropies standardised over the batch; zeros for constant entropy."""
    h = np.asarray(entropy, dtype=np.float64)
    sigma = h.std() if h.size else 0.0
    return np.zeros_like(h) if sigma == 0 else (h - h.mean()) / (sigma + eps)


@register_method("eapo")
class EAPO:
    display_name = "EAPO"
    paper = "He et al., 2026, Rethinking Token-Level Credit Assignment in RLVR: A Polarity-Entropy Analysis, arXiv 2604.11056"
    group = "classic-rl"
    trains = True
    implemented = "[APPROX] GRPO advantage + alpha sign(A) clip(Z_H, -|A|/phi, |A|/phi) per token (CBPO Eqs. 16-17 on batch-standardised entropy)"
    config = EAPOConfig

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor; EAPO's entropies are not normalised by it.
        self.cfg = EAPOConfig.from_overrides(overrides)

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        cfg = self.cfg
        entropies = [t.model_entropies() for g in groups for t in g]
        z = entropy_z(np.concatenate([np.zeros(0), *entropies]), cfg.eps)
        bounds = np.cumsum([0, *(len(h) for h in entropies)])
        out, k = [], 0
        for g in groups:
            adv = grpo_advantages(np.array([t.reward for t in g], dtype=np.float64), cfg.eps)
            row = []
            for t, a in zip(g, adv):
                row.append((modulate(np.full(t.n_model_tokens, a), z[bounds[k] : bounds[k + 1]], cfg.alpha, cfg.phi),
                            np.ones(t.n_model_tokens, dtype=np.int8)))
                k += 1
            out.append(row)
        return out
