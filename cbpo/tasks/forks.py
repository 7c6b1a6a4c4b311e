"""Decision forks, shared by the fork tasks ``arith_fork`` and ``search_fork`` (issue #14) and
the chain tasks ``arith_chain`` and ``search_chain`` (issue #25).

A fork task's success hinges on one known choice: the response's first action. Its SFT traces
take the losing choice for a set share ``p_lose`` of the rows (``task_options`` of
``configs/data/forks.yaml``), in the same format as the winning one, so the SFT policy mixes a
winning and a losing behaviour that RL can tell apart from the reward. Each row keeps the
usual task fields (``cbpo.tasks``) plus ``decisions``: the choice in its trace as character
spans ``{"start", "end", "kind", "wins"}``. Each task module's ``decision_spans(text,
question)`` finds the same choices in any response, so rollouts can be compared with the
annotations (``eval.credit_lab``); ``N_DECISIONS`` says how many a response has at most.

A chain task has two decisions per response, the first action and the first action after the
first tool observation (``chain_decisions``); a trace loses at most at one of them
(``chain_losers``). ``winning_prefixes`` starts the forced-choice evaluation (``evaluation.forced``).
"""
from __future__ import annotations

import random
import re
from typing import Any, Mapping, Sequence

from cbpo.chat import TOOL_TAGS

# The tags that open an action of the model, a tool call or the final answer, each in a group
# named after it.
_ACTION = re.compile("|".join(f"(?P<{name}>{re.escape(TOOL_TAGS[name][0])})" for name in ("python", "search", "answer")))


def first_action(text: str) -> re.Match | None:
    """The first opening ``<python>``, ``<search>`` or ``<answer>`` tag of a response (its
    name: ``lastgroup``). It comes before any observation, and observations are sanitised of
    tags, so it is the model's own."""
    return _ACTION.search(text)


def decision(start: int, end: int, kind: str, wins: bool) -> dict:
    return {"start": start, "end": end, "kind": kind, "wins": wins}


def first_action_decision(text: str, kinds: dict[str, tuple[str, bool]]) -> list[dict]:
    """The response's first action as its decision: the opening tag's span, with the
    ``(kind, wins)`` that ``kinds`` gives its tag name; none before the response acts."""
    match = first_action(text)
    if match is None:
        return []
    kind, wins = kinds[match.lastgroup]
    return [decision(match.start(), match.end(), kind, wins)]


def chain_decisions(text: str, kinds: Sequence[dict[str, tuple[str, bool]]]) -> list[dict]:
    """The chain tasks' decisions: the response's first action, then the first action after
    each tool observation, up to ``len(kinds)`` of them; decision ``i`` takes its
    ``(kind, wins)`` from ``kinds[i]``. It stops at an answer, or where no observation follows
    a tool call (observations are sanitised of tags, so each ``</result>`` is the loop's own)."""
    close = TOOL_TAGS["result"][1]
    found, at = [], 0
    for table in kinds:
        match = _ACTION.search(text, at)
        if match is None:
            break
        kind, wins = table[match.lastgroup]
        found.append(decision(match.start(), match.end(), kind, wins))
        end = text.find(close, match.end())
        if match.lastgroup == "answer" or end < 0:
            break
        at = end + len(close)
    return found


def losing_rows(rng: random.Random, n_rows: int, p_lose: float) -> set[int]:
    """Indices of the rows whose trace takes the losing choice: exactly ``round(p_lose * n)``
    of them, so the SFT mix is what the config says even for small splits."""
    if not 0.0 <= p_lose <= 1.0:
        raise ValueError(f"p_lose must lie in [0, 1], got {p_lose}")
    return set(rng.sample(range(n_rows), round(p_lose * n_rows)))


def chain_losers(rng: random.Random, n_rows: int, p_lose: float, n_decisions: int) -> list[int | None]:
    """Per row, the decision its trace loses at (``None``: it wins them all). Decision ``i``
    loses for ``round(p_lose * m)`` of the ``m`` rows whose traces reach it, so each decision
    of the SFT mix takes the losing choice at the configured rate."""
    at: list[int | None] = [None] * n_rows
    reaching = list(range(n_rows))
    for i in range(n_decisions):
        losers = losing_rows(rng, len(reaching), p_lose)
        for n in losers:
            at[reaching[n]] = i
        reaching = [row for n, row in enumerate(reaching) if n not in losers]
    return at


def winning_prefixes(task: str, seed: int, n_test: int, forced: int, options: Mapping[str, Any]) -> dict[str, str]:
    """By test question id: its winning trace up to the end of its ``forced``-th decision's
    choice (that action's opening tag), the start of a forced-choice evaluation
    (``evaluation.forced``). The task's generator with ``p_lose=0`` gives every test question
    its winning trace: ``p_lose`` changes only which traces lose, never the questions."""
    from cbpo.tasks import get_task

    rows = get_task(task).generate(seed, 0, n_test, **{**options, "p_lose": 0.0})["test"]
    prefixes = {}
    for row in rows:
        if len(row["decisions"]) < forced:
            raise ValueError(f"{task}: {row['id']} has {len(row['decisions'])} decisions, fewer than forced={forced}")
        prefixes[row["id"]] = row["trace"][: row["decisions"][forced - 1]["end"]]
    return prefixes
