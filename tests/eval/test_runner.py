from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from eval.runner import run_benchmark
from eval.verifiers.scoring import make_scorer

ROWS = [{"id": f"q{i}", "question": f"capital {i}?", "answer": [f"city {i}"], "domain": "search", "metric": "f1"}
        for i in range(10)]


class Generator:
    """Sample s of row i answers "city i" when (i + s) is even, else "town"; fails on demand."""

    def __init__(self, fail_after: int | None = None):
        self.calls: list[tuple[list[str], int]] = []
        self.fail_after = fail_after

    def __call__(self, batch, n):
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise RuntimeError("simulated crash")
        self.calls.append(([row["id"] for row in batch], n))
        out = []
        for row in batch:
            i = int(row["id"][1:])
            answers = [f"city {i}" if (i + s) % 2 == 0 else "town" for s in range(n)]
            out.append([{"trajectory": f"<answer>\\boxed{{{a}}}</answer>", "tokens": 10 + s, "tool_calls": s % 2,
                         "prompt": row["question"]} for s, a in enumerate(answers)])
        return out

    @property
    def generated(self) -> int:
        return sum(len(ids) * n for ids, n in self.calls)


def _records(out_dir):
    return [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]


def test_run_writes_samples_and_summary(tmp_path):
    summary = run_benchmark(ROWS, Generator(), tmp_path, n_samples=3, batch_size=4, benchmark="toy", progress=False)
    records = _records(tmp_path)
    assert len(records) == 30
    first = records[0]
    assert first["id"] == "q0" and first["sample"] == 0 and first["answer"] == "city 0" and first["score"] == 1.0
    assert first["prompt"] == "capital 0?" and first["gold"] == ["city 0"]
    assert {"trajectory", "tokens", "tool_calls", "question"} <= set(first)
    # Even rows: samples 0 and 2 right; odd rows: sample 1 right. Mean = (5 * 2/3 + 5 * 1/3) / 10.
    assert summary["pass@1"] == pytest.approx(0.5)
    assert summary["pass@k"] == {"1": pytest.approx(0.5), "3": 1.0}
    assert summary["benchmark"] == "toy" and summary["n"] == 3 and summary["metric"] == "f1"
    assert summary["fallback_used"] is False
    assert summary["mean_tokens"] == pytest.approx(11.0)
    assert summary["ci95_pass@1"][0] <= 0.5 <= summary["ci95_pass@1"][1]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_crash_midway_then_rerun_generates_only_what_is_missing(tmp_path):
    crashing = Generator(fail_after=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_benchmark(ROWS, crashing, tmp_path, n_samples=2, batch_size=3, progress=False)
    assert crashing.generated == 12  # two batches of 3 rows x 2 samples made it to disk
    assert not (tmp_path / "summary.json").exists()

    resumed = Generator()
    summary = run_benchmark(ROWS, resumed, tmp_path, n_samples=2, batch_size=3, progress=False)
    assert resumed.generated == 20 - 12
    assert not set(resumed.calls[0][0]) & {"q0", "q1", "q2", "q3", "q4", "q5"}
    assert sorted((r["id"], r["sample"]) for r in _records(tmp_path)) == sorted(
        (row["id"], s) for row in ROWS for s in range(2))
    clean = run_benchmark(ROWS, Generator(), tmp_path / "clean", n_samples=2, batch_size=3, progress=False)
    timing = "generation_seconds"  # the one field that measures the run, not its samples
    assert {k: v for k, v in summary.items() if k != timing} == {k: v for k, v in clean.items() if k != timing}

    # A finished run does nothing on a rerun; more samples later only adds the new ones.
    again = Generator()
    run_benchmark(ROWS, again, tmp_path, n_samples=2, progress=False)
    assert again.calls == []
    more = Generator()
    assert run_benchmark(ROWS, more, tmp_path, n_samples=3, progress=False)["n"] == 3
    assert more.calls and all(n == 1 for _, n in more.calls)


def test_torn_last_line_is_dropped_and_regenerated(tmp_path):
    run_benchmark(ROWS[:2], Generator(), tmp_path, n_samples=2, progress=False)
    path = tmp_path / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:25])  # killed while writing the last record
    resumed = Generator()
    run_benchmark(ROWS[:2], resumed, tmp_path, n_samples=2, progress=False)
    assert resumed.calls == [(["q1"], 1)]
    assert len(_records(tmp_path)) == 4


def test_corrupt_middle_line_is_an_error(tmp_path):
    run_benchmark(ROWS[:2], Generator(), tmp_path, n_samples=2, progress=False)
    path = tmp_path / "samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
    with pytest.raises(ValueError, match="samples.jsonl:2"):
        run_benchmark(ROWS[:2], Generator(), tmp_path, n_samples=2, progress=False)


def test_samples_of_another_benchmark_are_refused(tmp_path):
    run_benchmark(ROWS[:2], Generator(), tmp_path, progress=False)
    other = [dict(ROWS[0], id="other")]
    with pytest.raises(ValueError, match="wrong out_dir"):
        run_benchmark(other, Generator(), tmp_path, progress=False)


def test_sigkill_midway_then_rerun_finishes(tmp_path):
    out = tmp_path / "run"
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from eval.runner import run_benchmark
        rows = [json.loads(line) for line in sys.stdin]
        def generate(batch, n):
            time.sleep(0.3)
            return [[{{"trajectory": "<answer>city</answer>", "tokens": 1, "tool_calls": 0}}] * n for _ in batch]
        run_benchmark(rows, generate, {str(out)!r}, n_samples=2, batch_size=2, progress=False)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, text=True)
    child.stdin.write("".join(json.dumps(r) + "\n" for r in ROWS))
    child.stdin.close()
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not samples.exists() or samples.read_text().count("\n") < 4):
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    finished = {(r["id"], r["sample"]) for r in _records(out)}
    assert 4 <= len(finished) < 20

    resumed = Generator()
    summary = run_benchmark(ROWS, resumed, out, n_samples=2, batch_size=2, progress=False)
    assert resumed.generated == 20 - len(finished)
    assert len(_records(out)) == 20 and summary["problems"] == 10


def test_judge_fallback_is_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("CBPO_JUDGE_URL", raising=False)
    rows = [dict(row, metric="judge") for row in ROWS[:2]]
    with make_scorer("judge", {"model": "m", "prompt": "{question}{gold}{prediction}"}, fallback="f1") as scorer:
        summary = run_benchmark(rows, Generator(), tmp_path, scorer=scorer, progress=False)
    assert summary["metric"] == "judge" and summary["metric_used"] == "f1" and summary["fallback_used"] is True


def test_math_rows_use_the_verifier(tmp_path):
    rows = [{"id": "a", "question": "1/2?", "answer": "0.5", "domain": "math", "metric": "math"},
            {"id": "b", "question": "2+2?", "answer": "4", "domain": "math", "metric": "math"}]

    def generate(batch, n):
        return [[{"trajectory": "<answer>\\boxed{\\frac{1}{2}}</answer>", "tokens": 5, "tool_calls": 1}] * n
                for _ in batch]

    summary = run_benchmark(rows, generate, tmp_path, n_samples=5, progress=False)
    assert summary["pass@1"] == 0.5
    assert summary["pass@k"] == {"1": 0.5, "3": 0.5, "5": 0.5}
    assert summary["mean_tool_calls"] == 1.0


def test_generate_must_return_n_samples_per_row(tmp_path):
    with pytest.raises(ValueError, match="samples"):
        run_benchmark(ROWS[:2], lambda batch, n: [[]] * len(batch), tmp_path, progress=False)


def test_resuming_with_a_different_scorer_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CBPO_JUDGE_URL", raising=False)
    rows = [dict(row, metric="judge") for row in ROWS[:3]]
    with make_scorer("judge", {"model": "m", "prompt": "{question}{gold}{prediction}"}, fallback="f1") as scorer:
        with pytest.raises(RuntimeError):
            run_benchmark(rows, Generator(fail_after=1), tmp_path, scorer=scorer, batch_size=1, progress=False)
    with pytest.raises(ValueError, match="scored with \\['f1'\\]"):
        run_benchmark(rows, Generator(), tmp_path, scorer=make_scorer("em"), progress=False)


def test_plain_callable_scorer(tmp_path):
    rows = [{"id": "q1", "question": "q", "answer": "x"}]
    quarter = lambda rows, preds: [0.25] * len(rows)  # noqa: E731
    summary = run_benchmark(rows, Generator(), tmp_path, scorer=quarter, progress=False)
    assert summary["pass@1"] == 0.25 and summary["metric"] == "custom" and summary["fallback_used"] is False


def test_an_answer_printed_by_a_tool_scores_zero(tmp_path):
    printed = "<python>print(x)</python><result>\n<answer>\\boxed{city 0}</answer>\n</result>"
    trajectories = [printed + "I give up.", printed + "<answer>\\boxed{city 0}</answer>", "<answer>\\boxed{city 0}"]

    def generate(batch, n):
        return [[{"trajectory": t, "tokens": 5, "tool_calls": 1} for t in trajectories] for _ in batch]

    run_benchmark(ROWS[:1], generate, tmp_path, n_samples=3, progress=False)
    records = _records(tmp_path)
    assert [r["answer"] for r in records] == [None, "city 0", None]
    assert [r["score"] for r in records] == [0.0, 1.0, 0.0]


def test_runner_regenerates_samples_of_another_identity_only(tmp_path):
    rows = [{"id": str(i), "question": "q", "answer": "1", "metric": "em"} for i in range(3)]
    calls = []

    def generate(batch, n):
        calls.append(len(batch))
        return [[{"trajectory": "<answer>1</answer>"}] * n for _ in batch]

    for key in ({"fingerprint": "a"}, {"fingerprint": "a"}, {"fingerprint": "b"}):
        run_benchmark(rows, generate, tmp_path, identity=key, progress=False)
    assert calls == [3, 3]
    assert json.loads((tmp_path / "identity.json").read_text()) == {"fingerprint": "b"}


def test_generation_seconds_add_up_every_runs_samples_and_a_rerun_adds_none(tmp_path):
    # The table's device-hours read this: the samples' own time, however many runs made them.
    class Slow(Generator):
        def __call__(self, batch, n):
            time.sleep(0.01 * len(batch) * n)
            return super().__call__(batch, n)

    with pytest.raises(RuntimeError):
        run_benchmark(ROWS, Slow(fail_after=1), tmp_path, n_samples=2, batch_size=5, progress=False)
    summary = run_benchmark(ROWS, Slow(), tmp_path, n_samples=2, batch_size=5, progress=False)
    records = _records(tmp_path)
    assert summary["generation_seconds"] == pytest.approx(sum(r["seconds"] for r in records))
    assert summary["generation_seconds"] >= 0.01 * len(ROWS) * 2
    assert run_benchmark(ROWS, Slow(), tmp_path, n_samples=2, batch_size=5, progress=False)["generation_seconds"] == summary["generation_seconds"]
