from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cbpo.chat import format_observation
from cbpo.data import read_rows
from cbpo.tasks import generate_task
from cbpo.tasks import arith_fork, get_task, twohop, search_fork
from eval.verifiers.extract import extract_answer

FORKS = (arith_fork, search_fork)
CONFIG = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "data" / "forks.yaml").read_text())


@pytest.fixture(scope="module")
def splits():
    return {task: task.generate(seed=0, n_train=200, n_test=60, p_lose=0.6) for task in FORKS}


def rows(splits):
    return [(task, row) for task, s in splits.items() for row in s["train"] + s["test"]]


def test_the_forks_config_names_both_domains_and_a_losing_share():
    assert CONFIG["tasks"] == ["arith_fork", "search_fork"] and 0 < CONFIG["task_options"]["p_lose"] < 1
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


def start_of(row):
    """The entity a search_fork question asks about (its id ends with it)."""
    return row["id"].rsplit("-", 1)[1]


def test_search_fork_questions_ask_one_hop_with_a_wrong_claim_and_splits_share_no_entity(splits):
    w = twohop.world(0)
    templates = {hop.name: hop for hop in search_fork.HOPS}
    for split in ("train", "test"):
        for row in splits[search_fork][split]:
            hop = templates[row["id"].split("-")[2]]
            question, claim = row["question"].split(" A forum post says the answer is ")
            assert question == hop.question.format(start=start_of(row)) and row["answer"] == hop.answer(w, start_of(row))
            assert claim.endswith(".") and claim[:-1] != row["answer"]
            assert claim[:-1] in {hop.answer(w, s) for s in hop.starts(w)}  # a real answer of another entity
    assert not {start_of(r) for r in splits[search_fork]["train"]} & {start_of(r) for r in splits[search_fork]["test"]}


def test_every_trace_is_annotated_and_decision_spans_recovers_it(splits):
    for task, row in rows(splits):
        assert set(row) == {"id", "question", "answer", "domain", "trace", "decisions"}
        (d,) = row["decisions"]
        assert task.decision_spans(row["trace"], row["question"]) == row["decisions"]
        chosen = row["trace"][d["start"] : d["end"]]
        if task is arith_fork:
            assert (chosen, d["kind"]) in {("<python>", "call_tool"), ("<answer>", "answer_directly")}
        else:
            assert (chosen, d["kind"]) in {("<search>", "look_up"), ("<answer>", "trust_claim")}
        assert d["wins"] == (d["kind"] in ("call_tool", "look_up"))


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


def test_search_fork_traces_replay_the_search_environment_or_trust_the_claim_after_the_same_plan(splits):
    tool = twohop.search_tool(0, k=3)
    looked_up = re.compile(r"(?P<plan><think>[^<]+</think>)<search>(?P<query>\w+)</search>(?P<obs><result>.*?</result>)"
                           r"<think>(?P<fact>[^<]+)</think><answer>The answer is \\boxed\{(?P<boxed>\w+)\}</answer>", re.DOTALL)
    trusted = re.compile(r"(?P<plan><think>[^<]+</think>)<answer>The answer is \\boxed\{(?P<boxed>\w+)\}</answer>")
    for row in splits[search_fork]["train"][:60]:
        claim = row["question"].rsplit(" ", 1)[-1].rstrip(".")
        if row["decisions"][0]["wins"]:
            match = looked_up.fullmatch(row["trace"])
            assert match and match["query"] == start_of(row) and match["boxed"] == row["answer"], row["trace"]
            assert match["obs"] == format_observation(tool(start_of(row)))
            # the page's own sentence stating the answer, restated word for word
            assert match["fact"] in match["obs"] and re.search(rf"\b{row['answer']}\.$", match["fact"])
        else:
            match = trusted.fullmatch(row["trace"])
            assert match and match["boxed"] == claim, row["trace"]
        assert start_of(row) in match["plan"]


@pytest.mark.parametrize(("response", "expected"), [
    ("<think>plan</think><search>Bire</search>", [{"start": 19, "end": 27, "kind": "look_up", "wins": True}]),
    ("<think>plan</think><answer>\\boxed{Xan}</answer>", [{"start": 19, "end": 27, "kind": "trust_claim", "wins": False}]),
    ("<python>1</python>", [{"start": 0, "end": 8, "kind": "wrong_tool", "wins": False}]),
    ("<think>a plan cut by the token cap", []),
])
def test_search_fork_decision_spans_of_model_responses(response, expected):
    assert search_fork.decision_spans(response, "Who is the mayor of the city where Bire was born?") == expected


def test_data_step_passes_the_configs_task_options(tmp_path):
    paths = generate_task("arith_fork", tmp_path, 0, 10, 5, **CONFIG["task_options"])
    train = read_rows(paths["train"])
    assert sum(not r["decisions"][0]["wins"] for r in train) == round(CONFIG["task_options"]["p_lose"] * 10)
    assert read_rows(generate_task("arith_fork", tmp_path, 0, 10, 5, p_lose=1.0)["train"])[0]["decisions"][0]["kind"] \
        == "answer_directly"
