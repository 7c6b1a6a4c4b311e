from __future__ import annotations

import json

import pytest

import eval.benchmarks as benchmarks
from eval.benchmarks import benchmark_config, list_benchmarks, load_benchmark, scorer_for
from eval.verifiers.judge import JudgeUnavailable

TABLE1 = {
    "aime24": "AIME24", "aime25": "AIME25", "math500": "MATH500", "gsm8k": "GSM8K", "math": "MATH",
    "webwalker": "WebWalker", "hotpotqa": "HotpotQA", "2wiki": "2Wiki", "musique": "MuSiQue",
    "bamboogle": "Bamboogle",
}


def test_every_table1_benchmark_and_builtin_task_has_a_valid_config():
    assert set(TABLE1) | {"arith", "twohop", "arith_fork", "search_fork", "arith_chain", "search_chain", "relay", "relay_hard"} == set(list_benchmarks())
    for name, column in TABLE1.items():
        config = benchmark_config(name)
        assert config["display_name"] == column
        math = name in ("aime24", "aime25", "math500", "gsm8k", "math")
        assert config["domain"] == ("math" if math else "search")
    assert benchmark_config("webwalker")["metric"] == "judge"
    assert benchmark_config("hotpotqa")["metric"] == "f1"
    assert benchmark_config("arith")["metric"] == "math"
    assert benchmark_config("twohop")["metric"] == "f1"
    assert benchmark_config("arith_fork")["metric"] == "math"
    assert benchmark_config("search_fork")["metric"] == "f1"
    assert benchmark_config("arith_chain")["metric"] == "math" and benchmark_config("search_chain")["metric"] == "f1"


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(KeyError, match="aime24"):
        benchmark_config("aime2024")


def _write(path, lines):
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def test_local_rows_are_normalised(tmp_path):
    data = tmp_path / "benchmarks" / "gsm8k"
    data.mkdir(parents=True)
    _write(data / "test.jsonl", [
        {"question": "q1", "answer": "work\n#### 1,200", "idx": 0},
        {"question": "q2", "answer": "#### 7", "idx": 5},
    ])
    rows = load_benchmark("gsm8k", data_dir=tmp_path)
    assert rows == [
        {"id": "0", "question": "q1", "answer": "1,200", "domain": "math", "metric": "math"},
        {"id": "5", "question": "q2", "answer": "7", "domain": "math", "metric": "math"},
    ]
    assert len(load_benchmark("gsm8k", data_dir=tmp_path, limit=1)) == 1


def test_answer_types(tmp_path):
    file = _write(tmp_path / "t.jsonl", [
        {"problem": "a", "answer": 70, "id": 1},
        {"problem": "b", "answer": ["Paris", "paris, France"], "id": "2"},
    ])
    assert [r["answer"] for r in load_benchmark("aime25", path=file)] == ["70", ["Paris", "paris, France"]]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "expected a JSON object"),
        ({"answer": "1", "id": 3}, "question field 'problem'"),
        ({"problem": "q", "id": 3}, "answer field 'answer' is missing"),
        ({"problem": "q", "answer": [], "id": 3}, "empty list"),
        ({"problem": "q", "answer": {"x": 1}, "id": 3}, "not a number, string or list"),
        ({"problem": 12, "answer": "1", "id": 3}, "question field 'problem' is a int, not a string"),
        ({"problem": "q", "answer": float("nan"), "id": 3}, "answer field 'answer' is nan"),
        ({"problem": "q", "answer": "1"}, "id field 'id'"),
        ({"problem": "q", "answer": "1", "id": 0}, "duplicate id '0'"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, problem):
    file = _write(tmp_path / "bad.jsonl", [{"problem": "ok", "answer": "1", "id": 0}, line])
    with pytest.raises(ValueError, match=problem) as info:
        load_benchmark("aime25", path=file)
    assert f"{file}:2" in str(info.value)


def test_non_utf8_line_is_named(tmp_path):
    file = tmp_path / "bad.jsonl"
    file.write_bytes(b'{"problem": "ok", "answer": "1", "id": 0}\n{"problem": "\xff", "answer": "1", "id": 1}\n')
    with pytest.raises(ValueError, match="not UTF-8") as info:
        load_benchmark("aime25", path=file)
    assert f"{file}:2" in str(info.value)


def test_gsm8k_row_without_marker_is_malformed(tmp_path):
    file = _write(tmp_path / "g.jsonl", [{"question": "q", "answer": "no marker", "idx": 0}])
    with pytest.raises(ValueError, match="'####'"):
        load_benchmark("gsm8k", path=file)


def test_builtin_task_file_is_read_from_the_tasks_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="data/tasks/arith/test.jsonl"):
        load_benchmark("arith")  # default: ./data, as paths.data_dir
    row = {"id": "arith-0", "question": "2+3?", "answer": "5", "domain": "math", "trace": "..."}
    for where in (tmp_path / "data", tmp_path / "elsewhere"):
        (where / "tasks" / "arith").mkdir(parents=True)
        _write(where / "tasks" / "arith" / "test.jsonl", [{**row, "id": where.name}])
    expected = {"question": "2+3?", "answer": "5", "domain": "math", "metric": "math"}
    assert load_benchmark("arith") == [{"id": "data", **expected}]
    assert load_benchmark("arith", tasks_dir=tmp_path / "elsewhere") == [{"id": "elsewhere", **expected}]


def test_hub_source_mapping_takes_the_boxed_answer(monkeypatch):
    calls = []

    def fake_hub(source):
        calls.append(source["hub"])
        solution = "Thus $x = \\boxed{\\frac{1}{2}}$."
        return [("hub row 0", {"problem": "Solve.", "solution": solution, "level": "Level 1"})]

    monkeypatch.setattr(benchmarks, "_read_hub", fake_hub)
    rows = load_benchmark("math")
    assert calls == ["DigitalLearningGmbH/MATH-lighteval"]
    assert rows == [{"id": "0", "question": "Solve.", "answer": "\\frac{1}{2}", "domain": "math", "metric": "math"}]


def test_no_usable_source_says_what_was_tried(tmp_path, monkeypatch):
    def offline(source):
        raise ConnectionError("no network")

    monkeypatch.setattr(benchmarks, "_read_hub", offline)
    with pytest.raises(FileNotFoundError) as info:
        load_benchmark("math500", data_dir=tmp_path)
    assert "does not exist" in str(info.value) and "HuggingFaceH4/MATH-500" in str(info.value)


def test_bad_config_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks, "CONFIG_DIR", tmp_path)
    (tmp_path / "x.yaml").write_text("name: x\ndisplay_name: X\ndomain: math\nmetric: bleu\nsources: []\n")
    with pytest.raises(ValueError, match="metric 'bleu'"):
        benchmark_config("x")


def test_judge_without_endpoint_stops_unless_a_fallback_is_chosen(monkeypatch):
    monkeypatch.delenv("CBPO_JUDGE_URL", raising=False)
    with pytest.raises(JudgeUnavailable):
        scorer_for("webwalker")
    scorer = scorer_for("webwalker", fallback="f1")
    assert scorer.metric == "judge" and scorer.used == "f1" and scorer.fallback_used
    assert scorer([{"question": "q", "answer": ["New York City", "NYC"]}], ["NYC"]) == [1.0]
