"""Task files: every malformed row is one error naming the file, the line and the field."""
import json

import pytest

from cbpo.data import load_split, read_rows
from cbpo.tasks import generate_task

GOOD = {"id": "a-0", "question": "What is 2 + 3?", "answer": "5", "domain": "math", "trace": "<answer>\\boxed{5}</answer>"}


def _task_file(tmp_path, second_line: bytes):
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + second_line + b"\n")
    return path


def _row(**fields):
    return json.dumps({k: v for k, v in {**GOOD, **fields}.items() if v is not ...}).encode()


MALFORMED = {
    "not UTF-8": (b'{"id": "b", "question": "caf\xe9"}', "not UTF-8"),
    "not JSON": (b'{"id": "b", ', "not valid JSON"),
    "a string row": (b'"id question answer domain trace"', "expected a JSON object, got str"),
    "a list row": (b"[1, 2]", "expected a JSON object, got list"),
    "no trace": (_row(trace=...), "field 'trace' is missing"),
    "null trace": (_row(trace=None), "field 'trace' is a NoneType, not a string"),
    "numeric question": (_row(question=5), "field 'question' is a int, not a string"),
    "blank question": (_row(question="  "), "field 'question' is empty"),
    "object answer": (_row(answer={"x": 1}), "field 'answer' is {'x': 1}"),
    "no aliases": (_row(answer=[]), "field 'answer' is an empty list"),
    "null alias": (_row(answer=["5", None]), "field 'answer' is None"),
    "null id": (_row(id=None), "field 'id' is a NoneType"),
    "unknown domain": (_row(domain="chemistry"), "field 'domain' must be one of"),
    "no domain": (_row(domain=...), "field 'domain' is missing"),
}


@pytest.mark.parametrize("line,needle", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_row_names_file_line_and_field(tmp_path, line, needle):
    path = _task_file(tmp_path, line)
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert f"{path}:2: " in str(info.value)
    assert needle in str(info.value)


def test_rows_come_back_checked_with_numeric_golds_as_text(tmp_path):
    path = _task_file(tmp_path, _row(id=7, answer=[12, "twelve"]) + b"\n")
    assert read_rows(path) == [GOOD, {**GOOD, "id": "7", "answer": ["12", "twelve"]}]


def test_generated_tasks_read_back_unchanged(tmp_path):
    for task in ("arith", "twohop"):
        paths = generate_task(task, tmp_path, seed=0, n_train=5, n_test=3)
        rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
        assert load_split({"tasks": [task]}, tmp_path, "train") == rows
