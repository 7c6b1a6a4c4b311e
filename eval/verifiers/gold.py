"""A gold answer: one string, or the list of strings a benchmark accepts (its aliases)."""
from __future__ import annotations

from typing import Sequence

Gold = str | Sequence[str]


def gold_aliases(gold: Gold) -> list[str]:
    """A gold answer as its list of accepted strings."""
    aliases = [gold] if isinstance(gold, str) else [str(g) for g in gold]
    if not aliases:
        raise ValueError("gold answer has no aliases (empty list)")
    return aliases
