"""Chain task, math domain (issue #25): ``arith``'s word problems solved in two Python calls,
with a decision before each call, the second one after the first call's observation.

A winning trace computes the first operation, then the rest from its printed value::

    <think>Multiply, then subtract.</think><python>print(347 * 28)</python><result>
    9716
    </result><python>print(9716 - 59)</python><result>
    9657
    </result><answer>The answer is \\boxed{9657}</answer>

A trace loses at one decision by stating a mental estimate of the final value instead of the
call (``arith_fork.estimate``, never exact): at the first (``answer_directly``, as ArithFork)
or after the first observation (``answer_early``)::

    <think>Multiply, then subtract.</think><python>print(347 * 28)</python><result>
    9716
    </result><answer>The answer is \\boxed{9660}</answer>

Both decisions are the same for every question (call the tool), so what RL learns on the
training problems carries over to held-out ones; the second is taken mid-response, after a
tool observation, where ArithFork's only decision is the first action.
"""
from __future__ import annotations

import ast
import random

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks.arith import Problem, distinct_problems
from cbpo.tasks.arith_fork import estimate
from cbpo.tasks.forks import chain_decisions, chain_losers

# Per decision, first action tag -> (kind, wins). A search cannot compute the answer.
KINDS = (
    {"python": ("call_tool", True), "answer": ("answer_directly", False), "search": ("wrong_tool", False)},
    {"python": ("continue_tool", True), "answer": ("answer_early", False), "search": ("wrong_tool", False)},
)
N_DECISIONS = len(KINDS)  # per response, at most


def stages(expression: str) -> tuple[str, str]:
    """``expression`` in two calls: the operation Python evaluates first, and the rest with
    that operation's value in its place (``"a + b * c - d"`` -> ``"b * c"``, ``"a + V - d"``)."""
    tree = ast.parse(expression, mode="eval")

    def first(node: ast.AST) -> ast.BinOp:
        for child in (node.left, node.right):
            if isinstance(child, ast.BinOp):
                return first(child)
        return node

    inner = first(tree.body)
    if inner is tree.body:
        raise ValueError(f"{expression!r} has one operation: nothing is left for a second call")
    step = ast.unparse(inner)
    value = eval(compile(ast.Expression(inner), "<stage>", "eval"))  # integer literals only
    rest = ast.unparse(_replace(tree.body, inner, ast.Constant(value)))
    return step, rest


def _replace(node: ast.AST, old: ast.AST, new: ast.AST) -> ast.AST:
    if node is old:
        return new
    if isinstance(node, ast.BinOp):
        return ast.BinOp(_replace(node.left, old, new), node.op, _replace(node.right, old, new))
    return node


def chain_trace(problem: Problem, loses_at: int | None) -> tuple[str, list[dict]]:
    """The SFT response and its decisions; ``loses_at``: the decision (0, 1) that states the
    estimate, or ``None`` for the winning trace. Each observation is what ``print`` writes."""
    think, python, answer = TOOL_TAGS["think"], TOOL_TAGS["python"], TOOL_TAGS["answer"]
    step, rest = stages(problem.expression)
    text = f"{think[0]}{problem.plan}{think[1]}"
    for n, code in enumerate((step, rest)):
        if loses_at == n:
            text += f"{answer[0]}The answer is \\boxed{{{estimate(problem.value)}}}{answer[1]}"
            break
        printed = f"{eval(code)}\n"  # integer literals only
        text += f"{python[0]}print({code}){python[1]}{format_observation(printed)}"
    else:
        text += f"{answer[0]}The answer is \\boxed{{{problem.value}}}{answer[1]}"
    return text, decision_spans(text)


def decision_spans(text: str, question: str | None = None) -> list[dict]:
    """The first action, and the first action after the first observation (the question does
    not matter here)."""
    return chain_decisions(text, KINDS)


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` with distinct questions, deterministic in ``seed``; at
    each decision a share ``p_lose`` of the traces that reach it takes the losing choice
    (``forks.chain_losers``). The test split is drawn first, so neither its questions nor its
    traces change with ``n_train``; ``p_lose`` changes only which traces lose."""
    problems = distinct_problems(random.Random(f"arith_chain-{seed}"), n_train, n_test)
    lose_rng = random.Random(f"arith_chain-lose-{seed}")
    splits: dict[str, list[dict]] = {}
    for split in ("test", "train"):  # the losing draws in this order too
        splits[split] = []
        for n, (problem, loses_at) in enumerate(zip(problems[split], chain_losers(lose_rng, len(problems[split]), p_lose, len(KINDS)))):
            text, decisions = chain_trace(problem, loses_at)
            splits[split].append({"id": f"arith_chain-{split}-{n:06d}", "question": problem.question,
                                  "answer": str(problem.value), "domain": "math", "trace": text,
                                  "decisions": decisions})
    return {"train": splits["train"], "test": splits["test"]}
