"""What the branching and grouping agentic baselines (GiGPO, Tree-GRPO, ARPO, AEPO, BranPO) share:
the agent steps of a tool-using rollout, forks at exact token prefixes, per-problem sampling jobs
under the shared budget, and group-normalised advantages over arbitrary groups. (What every
method shares, e.g. ``sample_fresh`` and ``broadcast``, lives in ``cbpo.registry``.)

The branching methods (Tree-GRPO, ARPO, AEPO, BranPO) collect through per-problem jobs
(``cbpo.rollout.agent.run_jobs``): a problem's next forks join the running batch as soon as its
own previous rollouts are done, whatever the other problems are doing.

A *step* is one model turn: the model tokens from the start of the response, or from where the
model resumes after a tool observation, up to the next such point. Positions count model tokens
only, as everywhere in the suite.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from cbpo.credit import grpo_advantages
from cbpo.rollout.agent import Job
from cbpo.trajectory import Trajectory


def step_starts(t: Trajectory) -> np.ndarray:
    """Model-token position where each step of ``t`` starts; step k spans [starts[k], starts[k+1])."""
    return np.unique(np.array([0, *t.tool_boundaries()], dtype=np.int64))


def observation_before(t: Trajectory, b: int) -> tuple[int, ...]:
    """The observation tokens right before model token ``b`` (empty at the response start)."""
    end = int(t.model_positions()[b])
    start = end
    while start > 0 and not t.model_mask[start - 1]:
        start -= 1
    return tuple(t.response_ids[start:end])


def fork(t: Trajectory, b: int, index: int) -> Trajectory:
    """An unfinished branch of rollout ``index`` that keeps ``t``'s exact prefix before model
    token ``b``: token ids, observations and tool-call counts are copied, nothing is
    re-tokenised and no tool is re-run. ``b = 0`` keeps nothing (a restart from the prompt that
    still belongs to ``index``'s tree), valid even for a rollout without model tokens."""
    if b == 0:
        return Trajectory(prompt_ids=list(t.prompt_ids), kind="branch", parent=index, at=0)
    return t.branch_prefix(b, index)


def fresh(prompt: Sequence[int], n: int, kind: str = "parent") -> list[Trajectory]:
    """``n`` unstarted rollouts of one prompt."""
    return [Trajectory(prompt_ids=list(prompt), kind=kind) for _ in range(n)]


def fill_to_budget(group: list[Trajectory], prompt: Sequence[int], budget: int) -> Job:
    """Spend the problem's unused slots on fresh complete rollouts (kind "fill"); a job's last
    step, run with ``yield from``."""
    group += yield fresh(prompt, budget - len(group), "fill")


def grouped_advantages(values: Sequence[float], keys: Sequence[Hashable], eps: float = 1e-6, std: bool = True) -> np.ndarray:
    """Eq. 3 within each group of equal key: (v - mean_g) / (std_g + eps), sample std, a
    singleton group giving 0; with ``std=False`` only the group mean is subtracted."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(values)
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    for idx in members.values():
        out[idx] = grpo_advantages(values[idx], eps) if std else values[idx] - values[idx].mean()
    return out
