from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from cbpo.chat import split_observations
from cbpo.tasks import arith

TRACE = re.compile(
    r"<think>[A-Za-z ,.]+</think>"
    r"<python>print\((?P<expr>[0-9 +\-*/()]+)\)</python>"
    r"<result>\n(?P<printed>-?[0-9]+)\n</result>"
    r"<answer>The answer is \\boxed\{(?P<boxed>-?[0-9]+)\}</answer>"
)
OPERATOR = re.compile(r"//|[+\-*]")


@pytest.fixture(scope="module")
def data():
    return arith.generate(seed=7, n_train=400, n_test=100)


def test_same_seed_same_data_and_other_seed_differs(data):
    assert arith.generate(seed=7, n_train=400, n_test=100) == data
    assert arith.generate(seed=8, n_train=400, n_test=100)["test"] != data["test"]


def test_test_split_does_not_depend_on_train_size(data):
    assert arith.generate(seed=7, n_train=10, n_test=100)["test"] == data["test"]


def test_sizes_ids_and_disjoint_splits(data):
    assert len(data["train"]) == 400 and len(data["test"]) == 100
    train_q = {r["question"] for r in data["train"]}
    test_q = {r["question"] for r in data["test"]}
    assert len(train_q) == 400 and len(test_q) == 100
    assert not train_q & test_q
    ids = [r["id"] for split in data.values() for r in split]
    assert len(set(ids)) == len(ids)


def test_row_schema(data):
    for row in data["train"] + data["test"]:
        assert set(row) == {"id", "question", "answer", "domain", "trace"}
        assert row["domain"] == "math"
        assert isinstance(row["answer"], str) and row["answer"] == str(int(row["answer"]))


def test_trace_format_and_answer_is_the_expression_value(data):
    for row in data["train"] + data["test"]:
        match = TRACE.fullmatch(row["trace"])
        assert match, row["trace"]
        value = eval(match["expr"], {"__builtins__": {}})  # digits and operators only (regex)
        assert isinstance(value, int) and value >= 0
        assert str(value) == match["printed"] == match["boxed"] == row["answer"]
        assert "/" not in match["expr"].replace("//", "")  # exact integer division only


def test_two_to_three_operations_on_two_to_three_digit_operands(data):
    for row in data["train"]:
        expr = TRACE.fullmatch(row["trace"])["expr"]
        assert 2 <= len(OPERATOR.findall(expr)) <= 3
        operands = re.findall(r"[0-9]+", expr)
        assert all(10 <= int(x) <= 999 for x in operands), expr
        # The question states the operands in the order the code uses them.
        assert re.findall(r"[0-9]+", row["question"]) == operands


def test_result_block_is_exactly_what_the_code_prints(data):
    for row in data["test"][:8]:
        code = re.search(r"<python>(.*)</python>", row["trace"], re.DOTALL)[1]
        printed = subprocess.run(
            [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
        ).stdout
        observations = [text for text, is_model in split_observations(row["trace"]) if not is_model]
        assert observations == [f"<result>\n{printed}</result>"]


def test_all_templates_are_used(data):
    plans = {re.search(r"<think>(.*)</think>", r["trace"])[1] for r in data["train"]}
    expected = {arith.sample_problem(random.Random(i)).plan for i in range(200)}
    assert plans == expected and len(plans) >= 5


def test_negative_sizes_rejected_and_empty_allowed():
    with pytest.raises(ValueError, match="n_train=-1"):
        arith.generate(seed=0, n_train=-1, n_test=5)
    assert arith.generate(seed=0, n_train=0, n_test=0) == {"train": [], "test": []}
