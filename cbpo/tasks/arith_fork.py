"""Fork task, math domain: the arithmetic word problems of ``cbpo.tasks.arith``, whose
decision is whether to call the Python tool or to answer directly.

A winning trace is ``arith``'s (``<think>plan</think><python>…`` and the printed value); a
losing trace states a mental estimate instead of running the code::

    <think>Multiply, then subtract.</think><answer>The answer is \\boxed{7850}</answer>

The estimate is the value to the nearest ten, and never the value itself, so every losing
trace is wrong; the tiny model cannot multiply three-digit numbers either. The decision is
the tag after the plan (``call_tool``, which wins, or ``answer_directly``): the same for every
question, so what RL learns on the training problems carries over to held-out ones.
"""
from __future__ import annotations

import random

from cbpo.chat import TOOL_TAGS
from cbpo.tasks.arith import Problem, distinct_problems, trace
from cbpo.tasks.forks import decision, first_action_decision, losing_rows

# First action tag -> (kind, wins). A search cannot compute the answer.
KINDS = {"python": ("call_tool", True), "answer": ("answer_directly", False), "search": ("wrong_tool", False)}
N_DECISIONS = 1  # per response: its first action


def estimate(value: int) -> int:
    """A mental estimate of ``value``: the nearest ten, moved one ten up where that is exact."""
    rounded = round(value, -1)
    return rounded if rounded != value else value + 10


def direct_trace(problem: Problem) -> str:
    think, answer = TOOL_TAGS["think"], TOOL_TAGS["answer"]
    return (f"{think[0]}{problem.plan}{think[1]}"
            f"{answer[0]}The answer is \\boxed{{{estimate(problem.value)}}}{answer[1]}")


def decision_spans(text: str, question: str | None = None) -> list[dict]:
    """The response's first action (the question does not matter here): its opening tag."""
    return first_action_decision(text, KINDS)


def _row(split: str, n: int, problem: Problem, loses: bool) -> dict:
    text = direct_trace(problem) if loses else trace(problem)
    # The plan's closing tag ends where the action begins.
    at = text.index(TOOL_TAGS["think"][1]) + len(TOOL_TAGS["think"][1])
    tag = TOOL_TAGS["answer" if loses else "python"][0]
    kind = "answer_directly" if loses else "call_tool"
    return {"id": f"arith_fork-{split}-{n:06d}", "question": problem.question, "answer": str(problem.value),
            "domain": "math", "trace": text, "decisions": [decision(at, at + len(tag), kind, not loses)]}


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` with distinct questions, deterministic in ``seed``; a
    share ``p_lose`` of each split's traces answers directly. The test split is drawn first, so
    neither its questions nor its traces change with ``n_train``; ``p_lose`` changes only which
    traces lose, never the questions."""
    problems = distinct_problems(random.Random(f"arith_fork-{seed}"), n_train, n_test)
    lose_rng = random.Random(f"arith_fork-lose-{seed}")
    splits = {}
    for split in ("test", "train"):  # the losing draws in this order too
        losers = losing_rows(lose_rng, len(problems[split]), p_lose)
        splits[split] = [_row(split, n, problem, n in losers) for n, problem in enumerate(problems[split])]
    return {"train": splits["train"], "test": splits["test"]}
