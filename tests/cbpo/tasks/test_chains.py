from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import yaml

from cbpo.chat import format_observation
from cbpo.tasks import arith, arith_chain, get_task, search_chain, twohop
from cbpo.tasks.arith_fork import estimate
from cbpo.tasks.forks import chain_losers, winning_prefixes
from eval.verifiers.extract import extract_answer

CHAINS = (arith_chain, search_chain)
CONFIG = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "data" / "chains.yaml").read_text())
WINS = {"call_tool", "continue_tool", "look_up", "follow_bridge"}


@pytest.fixture(scope="module")
def splits():
    return {task: task.generate(seed=0, n_train=240, n_test=60, p_lose=0.5) for task in CHAINS}


def rows(splits):
    return [(task, row) for task, s in splits.items() for row in s["train"] + s["test"]]


def start_of(row):
    """The entity a search_chain question starts from (its id ends with it)."""
    return row["id"].rsplit("-", 1)[1]


def test_the_chains_config_names_both_domains_and_a_losing_share():
    assert CONFIG["tasks"] == ["arith_chain", "search_chain"] and 0 < CONFIG["task_options"]["p_lose"] < 1
    assert [get_task(name) for name in CONFIG["tasks"]] == list(CHAINS)
    assert {get_task(name).generate(0, 4, 2)["train"][0]["domain"] for name in CONFIG["tasks"]} == {"math", "search"}


@pytest.mark.parametrize("task", CHAINS, ids=lambda t: t.__name__)
def test_seeded_deterministic_and_the_test_split_independent_of_train_size_and_p_lose(task, splits):
    assert task.generate(seed=0, n_train=240, n_test=60, p_lose=0.5) == splits[task]
    assert task.generate(seed=1, n_train=240, n_test=60, p_lose=0.5)["train"] != splits[task]["train"]
    assert task.generate(seed=0, n_train=20, n_test=60, p_lose=0.5)["test"] == splits[task]["test"]
    winning = task.generate(seed=0, n_train=240, n_test=60, p_lose=0.0)
    for split in ("train", "test"):
        assert [r["question"] for r in winning[split]] == [r["question"] for r in splits[task][split]]
        assert all(len(r["decisions"]) == 2 and all(d["wins"] for d in r["decisions"]) for r in winning[split])


@pytest.mark.parametrize("task", CHAINS, ids=lambda t: t.__name__)
def test_splits_share_no_question_and_no_start_entity(task, splits):
    train, test = splits[task]["train"], splits[task]["test"]
    assert (len(train), len(test)) == (240, 60)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    ids = [r["id"] for r in train + test]
    assert len(set(ids)) == len(ids) and all(i.startswith(f"{task.__name__.split('.')[-1]}-") for i in ids)
    if task is search_chain:
        assert not {start_of(r) for r in train} & {start_of(r) for r in test}


def test_every_decision_is_annotated_found_again_and_decides_the_outcome(splits):
    for task, row in rows(splits):
        decisions = row["decisions"]
        assert task.decision_spans(row["trace"], row["question"]) == decisions
        assert [row["trace"][d["start"]:d["end"]] for d in decisions] == \
            [{True: "<python>" if task is arith_chain else "<search>", False: "<answer>"}[d["wins"]] for d in decisions]
        assert all(d["wins"] == (d["kind"] in WINS) for d in decisions)
        # A trace loses at most once, and only at its last decision; it has a second decision
        # only when it won the first, and that one comes after the first observation.
        assert [d["wins"] for d in decisions] in ([False], [True, False], [True, True])
        if len(decisions) == 2:
            assert row["trace"].index("</result>") < decisions[1]["start"]
        assert (extract_answer(row["trace"]) == row["answer"]) == all(d["wins"] for d in decisions), row["trace"]


@pytest.mark.parametrize("task", CHAINS, ids=lambda t: t.__name__)
def test_each_decision_loses_at_p_lose_among_the_traces_that_reach_it(task, splits):
    train = splits[task]["train"]
    first = [r["decisions"][0]["wins"] for r in train]
    second = [r["decisions"][1]["wins"] for r in train if len(r["decisions"]) == 2]
    assert first.count(False) == round(0.5 * 240) and second.count(False) == round(0.5 * first.count(True))


def test_chain_losers_at_the_extremes():
    assert chain_losers(random.Random(0), 5, 0.0, 2) == [None] * 5
    assert chain_losers(random.Random(0), 5, 1.0, 2) == [0] * 5
    with pytest.raises(ValueError, match="p_lose"):
        chain_losers(random.Random(0), 5, 1.5, 2)


@pytest.mark.parametrize(("expression", "step", "rest"), [
    ("12 + 34 * 56 - 78", "34 * 56", "12 + 1904 - 78"),
    ("(120 + 34 + 56) // 10", "120 + 34", "(154 + 56) // 10"),
    ("12 * 34 + 56 * 78", "12 * 34", "408 + 56 * 78"),
    ("(50 - 20) * 3", "50 - 20", "30 * 3"),
])
def test_stages_split_off_the_operation_python_evaluates_first(expression, step, rest):
    assert arith_chain.stages(expression) == (step, rest)
    assert eval(rest) == eval(expression)


def test_arith_chain_traces_compute_in_two_calls_or_state_an_estimate(splits):
    call = r"<python>print\((?P<code{n}>[^<]+)\)</python><result>\n(?P<out{n}>\d+)\n</result>"
    for row in splits[arith_chain]["train"]:
        wins = [d["wins"] for d in row["decisions"]]
        if wins == [True, True]:
            match = re.fullmatch(rf"<think>[^<]+</think>{call.format(n=1)}{call.format(n=2)}"
                                 r"<answer>The answer is \\boxed\{(?P<boxed>\d+)\}</answer>", row["trace"])
            assert match and [int(match["out1"]), int(match["out2"])] == [eval(match["code1"]), eval(match["code2"])]
            assert match["out1"] in match["code2"] and match["boxed"] == row["answer"] == match["out2"]
        else:
            opening = rf"<think>[^<]+</think>{call.format(n=1) if wins == [True, False] else ''}"
            match = re.fullmatch(rf"{opening}<answer>The answer is \\boxed\{{(?P<boxed>\d+)\}}</answer>", row["trace"])
            assert match and int(match["boxed"]) == estimate(int(row["answer"])) != int(row["answer"])


def test_arith_chain_questions_are_arith_questions():
    rng = random.Random("arith_chain-0")
    assert arith_chain.generate(0, 0, 3)["test"][0]["question"] == arith.sample_problem(rng).question


def test_search_chain_traces_replay_the_search_environment(splits):
    tool, w = twohop.search_tool(0, k=3), twohop.world(0)
    chains = {c.name: c for c in twohop.CHAINS}
    step = r"<search>(?P<q{n}>\w+)</search>(?P<obs{n}><result>.*?</result>)<think>(?P<fact{n}>[^<]+)</think>"
    for row in splits[search_chain]["train"][:80]:
        chain, start = chains[row["id"].split("-")[2]], start_of(row)
        bridge = chain.hop1(w, start)
        question, claim = row["question"].split(" A forum post says the answer is ")
        assert question == chain.question.format(start=start) and row["answer"] == chain.hop2(w, bridge)
        assert claim[:-1] != row["answer"]
        wins = [d["wins"] for d in row["decisions"]]
        steps = "".join(step.format(n=n) for n in range(1, 1 + sum(wins)))
        match = re.fullmatch(rf"<think>[^<]+</think>{steps}<answer>The answer is \\boxed\{{(?P<boxed>\w+)\}}</answer>",
                             row["trace"], re.DOTALL)
        assert match, row["trace"]
        assert match["boxed"] == {(False,): claim[:-1], (True, False): bridge, (True, True): row["answer"]}[tuple(wins)]
        for n, (entity, found) in enumerate(((start, bridge), (bridge, row["answer"]))[: sum(wins)], 1):
            assert match[f"q{n}"] == entity and match[f"obs{n}"] == format_observation(tool(entity))
            assert match[f"fact{n}"] in match[f"obs{n}"] and re.search(rf"\b{found}\b", match[f"fact{n}"])


@pytest.mark.parametrize(("response", "kinds"), [
    ("<think>p</think><search>Bire</search><result>\nPage 1: x\n</result><think>f</think><search>Tarun</search>",
     ["look_up", "follow_bridge"]),
    ("<think>p</think><search>Bire</search><result>\nPage 1: x\n</result><answer>\\boxed{Tarun}</answer>",
     ["look_up", "answer_early"]),
    ("<search>Bire</search><result>\nx\n</result><python>1</python><result>\n1\n</result><search>y</search>",
     ["look_up", "wrong_tool"]),  # only the first action after the first observation counts
    ("<answer>\\boxed{Xan}</answer><search>z</search>", ["trust_claim"]),
    ("<search>Bire</search><result>\nPage 1: cut by the token cap", ["look_up"]),
    ("<think>a plan cut by the token cap", []),
])
def test_search_chain_decision_spans_of_model_responses(response, kinds):
    assert [d["kind"] for d in search_chain.decision_spans(response, "a question")] == kinds


def test_arith_chain_decision_spans_of_model_responses():
    response = "<think>p</think><python>print(2 * 3)</python><result>\n6\n</result><answer>\\boxed{6}</answer>"
    second = response.index("<answer>")
    assert arith_chain.decision_spans(response) == [
        {"start": 16, "end": 24, "kind": "call_tool", "wins": True},
        {"start": second, "end": second + 8, "kind": "answer_early", "wins": False}]


@pytest.mark.parametrize("task", ["arith_chain", "search_chain", "arith_fork", "search_fork"])
def test_winning_prefixes_end_at_each_decisions_winning_tag(task):
    rows = get_task(task).generate(0, 0, 8, p_lose=0.0)["test"]
    for forced in (1, 2) if "chain" in task else (1,):
        prefixes = winning_prefixes(task, 0, 8, forced, {"p_lose": 0.7})
        assert list(prefixes) == [r["id"] for r in rows]
        for row in rows:
            assert row["trace"].startswith(prefixes[row["id"]])
            assert prefixes[row["id"]].endswith("<python>" if "arith" in task else "<search>")
            assert prefixes[row["id"]].count("</result>") == forced - 1
    with pytest.raises(ValueError, match="fewer than forced=2"):
        winning_prefixes("arith_fork", 0, 4, 2, {})
