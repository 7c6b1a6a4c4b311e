"""The trajectory record shared by rollout engines, the agent loop, CBPO and the trainer.

A tool-integrated rollout interleaves model-generated tokens and tool observations (Sec. 3,
Eq. 1). Every position the method talks about (branch boundaries, windows, segments) counts
model-generated tokens only; ``model_positions`` maps those to indices in ``response_ids``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass
class Trajectory:
    prompt_ids: list[int]
    # Everything after the prompt: model tokens and observation tokens, in order.
    response_ids: list[int] = field(default_factory=list)
    # True where the token was sampled from the policy (gets loss), False for observations.
    model_mask: list[bool] = field(default_factory=list)
    # log pi_old of each sampled token; 0.0 on observation tokens.
    logprobs: list[float] = field(default_factory=list)
    # Truncated top-K entropy -sum_{v in topK} p log p of each model token's next-token
    # distribution (un-renormalised, Eq. 6); 0.0 on observation tokens.
    entropies: list[float] = field(default_factory=list)
    finish: str = ""  # "answer" | "eos" | "length" | "turns" | "" (still running)
    tool_calls: int = 0  # calls on the whole path (a branch's copied prefix included: caps apply)
    copied_tool_calls: int = 0  # calls inherited from a branch's copied prefix
    tool_seconds: float = 0.0  # seconds spent in this rollout's own calls
    # Branch bookkeeping within one problem's rollout set R_x.
    kind: str = "parent"  # "parent" | "branch" | "fill"
    parent: int | None = None  # index of the parent in R_x (branches only)
    at: int | None = None  # branch boundary b, in model-token positions (branches only)
    reward: float | None = None
    # log pi_old - log pi_ref of each sampled token (k1), 0.0 on observation tokens: filled by the
    # trainer, after collection, only for a method whose reward carries the KL (registry.reward_kl).
    ref_kl: list[float] = field(default_factory=list)
    # Model-token positions where the model resumed after an observation that showed a dead end
    # (a tool error, a search that found nothing: cbpo.rollout.agent.shows_dead_end), in order.
    dead_ends: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.finish)

    @property
    def n_model_tokens(self) -> int:
        return int(sum(self.model_mask))

    @property
    def generated_tokens(self) -> int:
        """Model tokens this rollout sampled itself (a branch's copied prefix excluded)."""
        return self.n_model_tokens - (self.at or 0)

    @property
    def turn_tokens(self) -> int:
        """Model tokens of the turn in progress: those after the last observation (a branch cut
        mid-turn already holds part of its turn, which counts against the per-turn cap)."""
        n = 0
        for m in reversed(self.model_mask):
            if not m:
                break
            n += 1
        return n

    def model_positions(self) -> np.ndarray:
        """Indices into ``response_ids`` of the model-generated tokens, in order."""
        return np.flatnonzero(np.asarray(self.model_mask, dtype=bool))

    def model_entropies(self) -> np.ndarray:
        ent = np.asarray(self.entropies, dtype=np.float64)
        return ent[self.model_positions()] if len(ent) else ent

    def model_ref_kl(self) -> np.ndarray:
        if len(self.ref_kl) != len(self.response_ids):
            raise ValueError(f"ref_kl has {len(self.ref_kl)} values for {len(self.response_ids)} response tokens: "
                             "the trainer fills it for methods with registry.reward_kl > 0")
        return np.asarray(self.ref_kl, dtype=np.float64)[self.model_positions()]

    def tool_boundaries(self) -> list[int]:
        """Model-token positions where the model resumes right after a tool observation."""
        mask = np.asarray(self.model_mask, dtype=bool)
        if mask.size == 0:
            return []
        resumes = np.flatnonzero(mask[1:] & ~mask[:-1]) + 1
        cum = np.cumsum(mask) - 1  # model-token index of each response position
        return [int(cum[r]) for r in resumes]

    def alive_boundaries(self) -> list[int]:
        """The tool boundaries whose prefix no observation has shown to be a dead end: those
        before the first of ``dead_ends`` (``candidates=alive_boundary``)."""
        first = min(self.dead_ends, default=None)
        return [b for b in self.tool_boundaries() if first is None or b < first]

    def frontier_boundaries(self) -> list[int]:
        """The last of ``alive_boundaries``, if any: where the model made its last choice before
        an observation showed a dead end, or its last after an observation at all
        (``candidates=frontier_boundary``)."""
        return self.alive_boundaries()[-1:]

    def branch_prefix(self, b: int, parent_index: int) -> "Trajectory":
        """The exact prefix before model token ``b`` (observations included, Eq. 11), as an
        unfinished branch that an agent loop can continue."""
        pos = self.model_positions()
        if not 0 <= b < len(pos):
            raise ValueError(f"branch boundary {b} outside the {len(pos)} model tokens")
        cut = int(pos[b])
        return replace(
            self,
            response_ids=self.response_ids[:cut],
            model_mask=self.model_mask[:cut],
            logprobs=self.logprobs[:cut],
            entropies=self.entropies[:cut],
            ref_kl=self.ref_kl[:cut],
            dead_ends=[f for f in self.dead_ends if f <= b],
            finish="",
            tool_calls=self._observation_runs(cut),
            copied_tool_calls=self._observation_runs(cut),
            tool_seconds=0.0,
            kind="branch",
            parent=parent_index,
            at=b,
            reward=None,
        )

    def _observation_runs(self, cut: int) -> int:
        # Each tool call inserts one run of observation tokens; count the runs in the prefix.
        mask = np.asarray(self.model_mask[:cut], dtype=bool)
        if mask.size == 0:
            return 0
        return int((~mask[0]) + np.count_nonzero(mask[:-1] & ~mask[1:]))
