"""Decision forks, shared by the fork tasks ``arith_fork`` and ``search_fork`` (issue #14).

A fork task's success hinges on one known choice: the response's first action. Its SFT traces
take the losing choice for a set share ``p_lose`` of the rows (``task_options`` of
``configs/data/forks.yaml``), in the same format as the winning one, so the SFT policy mixes a
winning and a losing behaviour that RL can tell apart from the reward. Each row keeps the
usual task fields (``cbpo.tasks``) plus ``decisions``: the choice in its trace as character
spans ``{"start", "end", "kind", "wins"}``. Each fork module's ``decision_spans(text,
question)`` finds the same choice in any response, so rollouts can be compared with the
annotations (``eval.credit_lab``).
"""
from __future__ import annotations

import random
import re

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


def losing_rows(rng: random.Random, n_rows: int, p_lose: float) -> set[int]:
    """Indices of the rows whose trace takes the losing choice: exactly ``round(p_lose * n)``
    of them, so the SFT mix is what the config says even for small splits."""
    if not 0.0 <= p_lose <= 1.0:
        raise ValueError(f"p_lose must lie in [0, 1], got {p_lose}")
    return set(rng.sample(range(n_rows), round(p_lose * n_rows)))
