"""Answer extraction, the same for every method (paper Sec. 5.1: "same ... answer extraction").

A response in the Tool-Star/ARPO format ends with ``<answer>…\\boxed{…}…</answer>``. The
extracted answer is the content of the last ``\\boxed{}`` (or ``\\fbox{}``) inside the final
answer block, or the whole block when it holds no box. The answer is read from the model's own
text only: tool observations (``<result>…</result>``) are dropped first, so code that prints
``<answer>\\boxed{7}</answer>`` answers nothing. Anything that does not fit gives ``None``
("no answer"), never an exception: a policy's output is untrusted input.
"""
from __future__ import annotations

import re

from cbpo.chat import TOOL_TAGS, split_observations

_OPEN, _CLOSE = TOOL_TAGS["answer"]
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_answer(text: object) -> str | None:
    """The answer in the model-written part of ``text``, or None when there is none.

    - observations (``cbpo.chat.split_observations``) are removed; what they say never counts;
    - no ``<answer>`` tag at all → None;
    - the last ``<answer>`` opens the block; it ends at the next ``</answer>``; a block never
      closed → None: a response cut at the token cap mid-answer has not answered (the agent
      loop's "answer" finish is the same closing tag);
    - inside the block the last top-level ``\\boxed{…}`` wins, nested braces included; a box
      that never closes → None; a box holding only another box is unwrapped;
    - no box → the stripped block text; an empty result → None.
    """
    if not isinstance(text, str):
        return None
    text = "".join(piece for piece, is_model in split_observations(text) if is_model)
    start = text.rfind(_OPEN)
    if start < 0:
        return None
    block = text[start + len(_OPEN):]
    end = block.find(_CLOSE)
    if end < 0:
        return None
    block = block[:end]
    answer = _last_boxed(block) if _BOX.search(block) else block
    if answer is None:
        return None
    answer = answer.strip()
    return answer or None


def last_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{…}``/``\\fbox{…}`` in ``text`` (no answer tags
    needed), or None. Used on reference solutions (e.g. MATH's ``solution`` field)."""
    content = _last_boxed(text)
    return content.strip() if content is not None and content.strip() else None


def _last_boxed(text: str) -> str | None:
    content = None
    pos = 0
    while (m := _BOX.search(text, pos)) is not None:
        close = _matching_brace(text, m.end())
        if close is None:
            return None  # the last box never closes: malformed
        content = text[m.end():close]
        pos = close + 1
    # "\boxed{\boxed{5}}" answers 5, not "\boxed{5}".
    while content is not None and (inner := _whole_box(content.strip())) is not None:
        content = inner
    return content


def _whole_box(text: str) -> str | None:
    m = _BOX.match(text)
    if m is None:
        return None
    close = _matching_brace(text, m.end())
    return text[m.end():close] if close == len(text) - 1 else None


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` closing a group whose content starts at ``start``. A backslash escapes
    the next character, so ``\\{`` and ``\\}`` (literal braces in LaTeX) are not counted."""
    depth = 1
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None
