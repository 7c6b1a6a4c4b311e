from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cbpo.chat import format_observation
from cbpo.data import generate_task, read_rows
from cbpo.tasks import arith_fork, get_task, twohop, twohop_fork
from eval.extract import extract_answer

FORKS = (arith_fork, twohop_fork)
CONFIG = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "data" / "forks.yaml").read_text())


@pytest.fixture(scope="module")
def splits():
    return {task: task.generate(seed=0, n_train=200, n_test=60, p_lose=0.6) for task in FORKS}


def rows(splits):
    return [(task, row) for task, s in splits.items() for row in s["train"] + s["test"]]


def test_the_forks_config_names_both_domains_and_a_losing_share():
    assert CONFIG["tasks"] == ["arith_fork", "twohop_fork"] and 0 < CONFIG["task_options"]["p_lose"] < 1
    assert [get_task(name) for name in CONFIG["tasks"]] == list(FORKS)
    assert {get_task(name).generate(0, 4, 2)["train"][0]["domain"] for name in CONFIG["tasks"]} == {"math", "search"}


@pytest.mark.parametrize("task", FORKS, ids=lambda t: t.__name__)
def test_same_seed_same_rows_other_seed_other_rows(task, splits):
    assert task.generate(seed=0, n_train=200, n_test=60, p_lose=0.6) == splits[task]
    assert task.generate(seed=1, n_train=200, n_test=60, p_lose=0.6)["train"] != splits[task]["train"]


@pytest.mark.parametrize("task", FORKS, ids=lambda t: t.__name__)
def test_test_split_does_not_depend_on_train_size_and_p_lose_only_moves_traces(task, splits):
    assert task.generate(seed=0, n_train=20, n_test=60, p_lose=0.6)["test"] == splits[task]["test"]
    winning = task.generate(seed=0, n_train=200, n_test=60, p_lose=0.0)
    for split in ("train", "test"):
        assert [r["question"] for r in winning[split]] == [r["question"] for r in splits[task][split]]
        assert all(r["decisions"][0]["wins"] for r in winning[split])


@pytest.mark.parametrize("task", FORKS, ids=lambda t: t.__name__)
def test_splits_are_disjoint_and_ids_unique(task, splits):
    train, test = splits[task]["train"], splits[task]["test"]
    assert (len(train), len(test)) == (200, 60)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    ids = [r["id"] for r in train + test]
    assert len(set(ids)) == len(ids) and all(i.startswith(f"{task.__name__.split('.')[-1]}-") for i in ids)


def test_twohop_fork_subjects_are_disjoint_between_splits(splits):
    subject = {split: {twohop_fork.question_names(r["question"])[0] for r in splits[twohop_fork][split]}
               for split in ("train", "test")}
    assert not subject["train"] & subject["test"]


def test_every_trace_is_annotated_and_decision_spans_recovers_it(splits):
    for task, row in rows(splits):
        assert set(row) == {"id", "question", "answer", "domain", "trace", "decisions"}
        (d,) = row["decisions"]
        assert task.decision_spans(row["trace"], row["question"]) == row["decisions"]
        chosen = row["trace"][d["start"] : d["end"]]
        if task is arith_fork:
            assert (chosen, d["kind"]) in {("<python>", "call_tool"), ("<answer>", "answer_directly")}
        else:
            subject, asker = twohop_fork.question_names(row["question"])
            assert (chosen, d["kind"]) in {(subject, "good_query"), (asker, "misleading_query")}
            assert subject != asker and row["question"].startswith(f"Asked by {asker}: ")
        assert d["wins"] == (d["kind"] in ("call_tool", "good_query"))


@pytest.mark.parametrize("task", FORKS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("p_lose", [0.0, 0.3, 0.6, 1.0])
def test_losing_share_of_each_split_is_p_lose(task, p_lose):
    data = task.generate(seed=3, n_train=150, n_test=40, p_lose=p_lose)
    for split, size in (("train", 150), ("test", 40)):
        losing = sum(not r["decisions"][0]["wins"] for r in data[split])
        assert losing == round(p_lose * size)


def test_p_lose_outside_the_unit_interval_is_refused():
    with pytest.raises(ValueError, match="p_lose"):
        arith_fork.generate(0, 10, 5, p_lose=1.5)


def test_winning_traces_box_the_gold_answer_and_losing_traces_a_wrong_one(splits):
    for _, row in rows(splits):
        boxed = extract_answer(row["trace"])
        assert (boxed == row["answer"]) == row["decisions"][0]["wins"], row["trace"]


def test_arith_fork_traces_are_arith_traces_or_a_direct_estimate(splits):
    for row in splits[arith_fork]["train"]:
        if row["decisions"][0]["wins"]:
            assert re.fullmatch(r"<think>[^<]+</think><python>print\([^<]+\)</python><result>\n\d+\n</result>"
                                r"<answer>The answer is \\boxed\{\d+\}</answer>", row["trace"])
        else:
            match = re.fullmatch(r"<think>[^<]+</think><answer>The answer is \\boxed\{(\d+)\}</answer>", row["trace"])
            assert match and int(match[1]) % 10 == 0 and abs(int(match[1]) - int(row["answer"])) <= 10


def test_twohop_fork_traces_replay_the_search_environment(splits):
    tool = twohop.search_tool(0, k=3)
    trace = re.compile(r"<search>(?P<q1>\w+)</search>(?P<r1><result>.*?</result>)<think>[^<]+</think>"
                       r"<search>(?P<q2>\w+)</search>(?P<r2><result>.*?</result>)"
                       r"<answer>The answer is \\boxed\{\w+\}</answer>", re.DOTALL)
    for row in splits[twohop_fork]["train"][:30]:
        match = trace.fullmatch(row["trace"])
        assert match, row["trace"]
        assert match["r1"] == format_observation(tool(match["q1"]))
        assert match["r2"] == format_observation(tool(match["q2"]))


@pytest.mark.parametrize(("response", "expected"), [
    ("<think>plan</think><python>print(1)</python>", [{"start": 19, "end": 27, "kind": "call_tool", "wins": True}]),
    ("<answer>The answer is \\boxed{3}</answer>", [{"start": 0, "end": 8, "kind": "answer_directly", "wins": False}]),
    ("<think>plan</think><search>x</search>", [{"start": 19, "end": 27, "kind": "wrong_tool", "wins": False}]),
    ("<think>a plan cut by the token cap", []),
])
def test_arith_fork_decision_spans_of_model_responses(response, expected):
    assert arith_fork.decision_spans(response) == expected


def test_twohop_fork_decision_spans_of_model_responses():
    question = "Asked by Kovi: Who is the mayor of the city where Bire was born?"
    assert twohop_fork.question_names(question) == ("Bire", "Kovi")
    spans = twohop_fork.decision_spans
    assert spans("<think>hm</think><search>Kovi</search><result>\nPage 1: Kovi\n</result>", question) == [
        {"start": 25, "end": 29, "kind": "misleading_query", "wins": False}]
    assert spans("<search>Bire</search><search>Kovi</search>", question)[0]["kind"] == "good_query"
    # A query the token cap cut runs to the end of the response.
    assert spans("<search>Bi", question) == [{"start": 8, "end": 10, "kind": "other_query", "wins": False}]
    assert spans("<answer>\\boxed{Xan}</answer>", question)[0]["kind"] == "answer_directly"
    assert spans("<python>1</python>", question)[0]["kind"] == "wrong_tool"
    with pytest.raises(ValueError, match="twohop_fork question"):
        spans("<search>Bire</search>", "Who is the mayor of the city where Bire was born?")


def test_data_step_passes_the_configs_task_options(tmp_path):
    paths = generate_task("arith_fork", tmp_path, 0, 10, 5, **CONFIG["task_options"])
    train = read_rows(paths["train"])
    assert sum(not r["decisions"][0]["wins"] for r in train) == round(CONFIG["task_options"]["p_lose"] * 10)
    assert read_rows(generate_task("arith_fork", tmp_path, 0, 10, 5, p_lose=1.0)["train"])[0]["decisions"][0]["kind"] \
        == "answer_directly"
