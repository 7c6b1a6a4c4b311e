"""Built-in, deterministic tool tasks (offline): each module exposes
``generate(seed, n_train, n_test) -> {"train": rows, "test": rows}``.

A row is ``{"id": str, "question": str, "answer": str | list[str], "domain": "math" | "search",
"trace": str}``, ``trace`` being the full assistant response used for SFT, in the Tool-Star/ARPO
tool format (``<python>…</python>`` or ``<search>…</search>`` → ``<result>…</result>`` →
``<answer>…\\boxed{…}…</answer>``).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Sequence

from cbpo.data import task_file, write_jsonl
from cbpo.tools import ToolsConfig, build_tools

TASKS = {
    "arith": "cbpo.tasks.arith",
    "twohop": "cbpo.tasks.twohop",
    # Fork tasks (cbpo.tasks.forks): rows also carry ``decisions``; generate takes ``p_lose``.
    "arith_fork": "cbpo.tasks.arith_fork",
    "search_fork": "cbpo.tasks.search_fork",
    # Chain tasks (issue #25): two decisions per response, the second after a tool observation.
    "arith_chain": "cbpo.tasks.arith_chain",
    "search_chain": "cbpo.tasks.search_chain",
    # The credit-assignment testbed (issue #36): four decisions, three after tool observations.
    "relay": "cbpo.tasks.relay",
    "relay_hard": "cbpo.tasks.relay_hard",  # the relay with SFT starting near 25% per decision
}


def get_task(name: str):
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name])


def generate_task(task: str, data_dir: str | Path, seed: int, n_train: int, n_test: int,
                  **options: Any) -> dict[str, Path]:
    """``options``: the data config's ``task_options``, the task generator's own arguments."""
    splits = get_task(task).generate(seed, n_train, n_test, **options)
    out = {}
    for split in ("train", "test"):
        out[split] = task_file(data_dir, task, split)
        write_jsonl(out[split], splits[split])
    return out


def has_decisions(name: str) -> bool:
    """Whether ``name`` is a built-in task that marks its decisions (``decision_spans``,
    ``N_DECISIONS``: the fork and chain tasks, ``cbpo.tasks.forks``); any other name, a
    benchmark for instance, is not."""
    return name in TASKS and hasattr(get_task(name), "decision_spans")


def environment_tools(names: Sequence[str], tools_cfg: ToolsConfig, seed: int,
                      data_root: str | Path | None = None, tasks: Sequence[str] = ()) -> dict[str, Callable[[str], str]]:
    """The tools a run's rollouts call (``cbpo.tools.build_tools``): without a ``search_backend``,
    search is bm25 over the built-in tasks' corpus of ``seed``: the passages of every task of
    ``tasks`` (the data's) that has a corpus of its own (``relay``'s lockers, ``twohop``'s
    world), else the two-hop world (``cbpo.tasks.twohop``: the fork and chain search tasks ask
    the same world)."""
    corpus = None
    if "search" in names and tools_cfg.search_backend is None:
        own = [task for task in (get_task(t) for t in tasks if t in TASKS) if hasattr(task, "corpus")]
        corpus = [passage for task in own or [get_task("twohop")] for passage in task.corpus(seed)]
    return build_tools(names, tools_cfg, corpus=corpus, data_root=data_root)
