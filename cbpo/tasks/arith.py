"""Built-in math task: seeded multi-step arithmetic word problems that the Python tool solves.

Each problem takes 2–3 integer operations on 2–3-digit operands (exact ``//`` division only),
phrased from a few sentence templates. The SFT trace is the Tool-Star/ARPO tool format::

    <think>plan</think><python>print(a + b * c - d)</python><result>\\nV\\n</result>
    <answer>The answer is \\boxed{V}</answer>

where the ``<result>`` block is exactly what running the code prints. The test split is drawn
first, so it does not change with ``n_train``; train and test never share a question.
"""
from __future__ import annotations

import random
from typing import Callable, NamedTuple

from cbpo.chat import TOOL_TAGS, format_observation

NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lina", "Ravi", "Ella", "Sam")
THINGS = ("stickers", "marbles", "stamps", "cards", "beads", "shells", "coins", "pebbles")


class Problem(NamedTuple):
    question: str
    expression: str  # a Python integer expression whose printed value is the answer
    value: int
    plan: str


def _operand(rng: random.Random, min_digits: int = 2, max_digits: int = 3) -> int:
    # At most three digits: one token each for the tiny model's tokenizer (cbpo.models).
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _packs(rng: random.Random) -> Problem | None:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c, d = _operand(rng), _operand(rng, 2, 3), _operand(rng, 2, 2), _operand(rng)
    value = a + b * c - d
    if value < 0:
        return None
    question = (
        f"{name} has {a} {thing}. {name} buys {b} packs of {c} {thing} each and then gives "
        f"away {d} {thing}. How many {thing} does {name} have now?"
    )
    return Problem(question, f"{a} + {b} * {c} - {d}", value, "Add the packs, then subtract.")


def _warehouse(rng: random.Random) -> Problem | None:
    thing = rng.choice(THINGS)
    a, b, c, d = _operand(rng, 2, 3), _operand(rng, 2, 3), _operand(rng), _operand(rng)
    value = a * b - c + d
    if a * b < c:
        return None
    question = (
        f"A warehouse stores {a} crates with {b} {thing} in each. {c} {thing} are sold and "
        f"{d} more arrive. How many {thing} are in the warehouse?"
    )
    return Problem(question, f"{a} * {b} - {c} + {d}", value, "Multiply, subtract, then add.")


def _earnings(rng: random.Random) -> Problem | None:
    name = rng.choice(NAMES)
    a, b, c = _operand(rng, 2, 3), _operand(rng, 2, 3), _operand(rng)
    value = a * b - c
    if value < 0:
        return None
    question = (
        f"{name} earns {a} dollars a day for {b} days and spends {c} dollars. "
        f"How many dollars does {name} have left?"
    )
    return Problem(question, f"{a} * {b} - {c}", value, "Multiply, then subtract.")


def _share(rng: random.Random) -> Problem | None:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c, d = _operand(rng), _operand(rng), _operand(rng, 2, 3), _operand(rng, 2, 2)
    c += -(a + b + c) % d  # make the total divisible so the share is exact
    if c > 999:
        return None
    question = (
        f"{name} collects {a}, {b} and {c} {thing} on three days and shares them equally "
        f"among {d} friends. How many {thing} does each friend get?"
    )
    return Problem(question, f"({a} + {b} + {c}) // {d}", (a + b + c) // d, "Add, then divide.")


def _order(rng: random.Random) -> Problem | None:
    a, b, c, d = (_operand(rng, 2, 3) for _ in range(4))
    question = (
        f"A school orders {a} boxes of {b} pencils and {c} boxes of {d} pens. "
        f"How many items does the school order in total?"
    )
    return Problem(question, f"{a} * {b} + {c} * {d}", a * b + c * d, "Multiply twice, then add.")


def _tank(rng: random.Random) -> Problem | None:
    a, b = _operand(rng, 3, 3), _operand(rng, 2, 2)
    if a // b < 10:  # no two-digit hour count keeps the tank non-negative
        return None
    c = rng.randint(10, a // b)
    value = a - b * c
    question = (
        f"A tank holds {a} liters of water. {b} liters leak out every hour for {c} hours. "
        f"How many liters remain?"
    )
    return Problem(question, f"{a} - {b} * {c}", value, "Multiply, then subtract.")


def _rows(rng: random.Random) -> Problem | None:
    a, b, c = _operand(rng, 2, 3), _operand(rng, 2, 3), _operand(rng, 2, 3)
    if a <= b:
        return None
    question = (
        f"A farmer plants {a} rows of trees, but {b} rows fail. Each remaining row has "
        f"{c} trees. How many trees are left?"
    )
    return Problem(question, f"({a} - {b}) * {c}", (a - b) * c, "Subtract, then multiply.")


TEMPLATES: tuple[Callable[[random.Random], Problem | None], ...] = (
    _packs, _warehouse, _earnings, _share, _order, _tank, _rows,
)


def trace(problem: Problem) -> str:
    """The SFT response for ``problem``; the observation is what ``print`` writes."""
    think, python, answer = TOOL_TAGS["think"], TOOL_TAGS["python"], TOOL_TAGS["answer"]
    printed = f"{problem.value}\n"
    return (
        f"{think[0]}{problem.plan}{think[1]}"
        f"{python[0]}print({problem.expression}){python[1]}"
        f"{format_observation(printed)}"
        f"{answer[0]}The answer is \\boxed{{{problem.value}}}{answer[1]}"
    )


def sample_problem(rng: random.Random) -> Problem:
    while (problem := rng.choice(TEMPLATES)(rng)) is None:
        pass  # rejected draw (negative result); every template accepts most draws
    return problem


def distinct_problems(rng: random.Random, n_train: int, n_test: int) -> dict[str, list[Problem]]:
    """``{"test": problems, "train": problems}`` drawn from ``rng``, no question twice across
    both; the test split first, so it does not change with ``n_train``."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_test={n_test}")
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {}
    for split, size in (("test", n_test), ("train", n_train)):
        problems = splits[split] = []
        while len(problems) < size:
            problem = sample_problem(rng)
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
    return splits


def generate(seed: int, n_train: int, n_test: int) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` with distinct questions, deterministic in ``seed``."""
    problems = distinct_problems(random.Random(f"arith-{seed}"), n_train, n_test)
    return {split: [{"id": f"arith-{split}-{n:06d}", "question": problem.question, "answer": str(problem.value),
                     "domain": "math", "trace": trace(problem)} for n, problem in enumerate(problems[split])]
            for split in ("train", "test")}
