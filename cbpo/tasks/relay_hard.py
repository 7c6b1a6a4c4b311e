"""The relay started lower (issue #36): ``cbpo.tasks.relay`` with SFT traces that lose at each
decision they reach three times in four, so the SFT policy starts near 25% per decision. That is
where the credit simulator separates branching below prefixes still alive from GRPO, and ties
them at relay's 50% (``python -m cbpo.lab.credit_sim --start 0.25``; docs/cpu-testbed.md). Its
own task name keeps its files (``data/tasks/relay_hard/``), row ids and benchmark apart from the
relay's, so both studies can share a working directory.
"""
from __future__ import annotations

from cbpo.tasks.relay import KINDS, N_DECISIONS, corpus, decision_spans
from cbpo.tasks.relay import generate as relay_generate

__all__ = ["KINDS", "N_DECISIONS", "P_LOSE", "corpus", "decision_spans", "generate"]  # the task interface
P_LOSE = 0.75


def generate(seed: int, n_train: int, n_test: int, p_lose: float = P_LOSE, k: int = 3) -> dict[str, list[dict]]:
    """The relay's rows (``cbpo.tasks.relay.generate``) with ``p_lose`` 0.75 unless given, ids
    ``relay_hard-…``; the worlds and the test questions are the relay's."""
    return relay_generate(seed, n_train, n_test, p_lose, k, task="relay_hard")
