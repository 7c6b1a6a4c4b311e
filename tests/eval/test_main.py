"""The public `python -m eval score` contract, through a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

LINES = [
    {"metric": "math", "prediction": "<answer>so \\boxed{\\frac{1}{2}}</answer>", "gold": "0.5"},
    {"metric": "math", "prediction": "<answer>\\boxed{3}</answer>", "gold": "4"},
    {"metric": "math", "prediction": "\\boxed{0.5} without tags", "gold": "0.5"},
    {"metric": "f1", "prediction": "<answer>\\boxed{New York}</answer>", "gold": ["New York City", "NYC"]},
    {"metric": "em", "prediction": "<answer>NYC</answer>", "gold": ["New York City", "NYC"]},
    {"metric": "f1", "prediction": "<answer>unclosed \\boxed{Paris", "gold": "Paris"},
    {"metric": "math", "prediction": "<answer>\\boxed{70}</answer>", "gold": 70},
]


def _run(args, stdin):
    command = [sys.executable, "-m", "eval", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120)


def test_score_prints_one_line_per_input_in_order(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    result = _run(["score", str(path)], "")
    assert result.returncode == 0, result.stderr
    scores = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    assert scores == [1.0, 0.0, 0.0, 0.8, 1.0, 0.0, 1.0]


def test_score_reads_stdin_and_names_bad_lines():
    result = _run(["score", "-"], json.dumps(LINES[3]) + "\n" + json.dumps({"metric": "bleu"}) + "\n")
    assert result.returncode == 2
    assert "-:2" in result.stderr and "bleu" in result.stderr
