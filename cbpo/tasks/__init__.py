"""Built-in, deterministic tool tasks (offline): each module exposes
``generate(seed, n_train, n_test) -> {"train": rows, "test": rows}``.

A row is ``{"id": str, "question": str, "answer": str | list[str], "domain": "math" | "search",
"trace": str}``, ``trace`` being the full assistant response used for SFT, in the Tool-Star/ARPO
tool format (``<python>…</python>`` or ``<search>…</search>`` → ``<result>…</result>`` →
``<answer>…\\boxed{…}…</answer>``).
"""
from __future__ import annotations

import importlib

TASKS = {
    "arith": "cbpo.tasks.arith",
    "twohop": "cbpo.tasks.twohop",
    # Fork tasks (cbpo.tasks.forks): rows also carry ``decisions``; generate takes ``p_lose``.
    "arith_fork": "cbpo.tasks.arith_fork",
    "search_fork": "cbpo.tasks.search_fork",
    # Chain tasks (issue #25): two decisions per response, the second after a tool observation.
    "arith_chain": "cbpo.tasks.arith_chain",
    "search_chain": "cbpo.tasks.search_chain",
}


def get_task(name: str):
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name])


def has_decisions(name: str) -> bool:
    """Whether ``name`` is a built-in task that marks its decisions (``decision_spans``,
    ``N_DECISIONS``: the fork and chain tasks, ``cbpo.tasks.forks``); any other name, a
    benchmark for instance, is not."""
    return name in TASKS and hasattr(get_task(name), "decision_spans")
