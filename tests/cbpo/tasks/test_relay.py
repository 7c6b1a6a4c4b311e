from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks import environment_tools, get_task, has_decisions, relay
from cbpo.tools import ToolsConfig
from eval.verifiers.extract import extract_answer

ROOT = Path(__file__).resolve().parents[3]
CONFIG = yaml.safe_load((ROOT / "configs" / "data" / "relay.yaml").read_text())
CALL = re.compile(r"<(python|search)>(.*?)</\1>(<result>\n.*?\n</result>)?", re.S)


@pytest.fixture(scope="module")
def splits():
    return relay.generate(seed=0, n_train=400, n_test=60, p_lose=0.5)


def test_the_relay_config_is_the_task_with_a_losing_share_and_both_tools():
    assert CONFIG["tasks"] == ["relay"] and get_task("relay") is relay and CONFIG["tools"] == ["python", "search"]
    assert 0 < CONFIG["task_options"]["p_lose"] < 1


def test_seeded_deterministic_and_the_test_split_independent_of_train_size_and_p_lose(splits):
    assert relay.generate(seed=0, n_train=400, n_test=60, p_lose=0.5) == splits
    assert relay.generate(seed=1, n_train=400, n_test=60, p_lose=0.5)["train"] != splits["train"]
    assert relay.generate(seed=0, n_train=10, n_test=60, p_lose=0.5)["test"] == splits["test"]
    winning = relay.generate(seed=0, n_train=400, n_test=60, p_lose=0.0)
    assert [r["question"] for r in winning["test"]] == [r["question"] for r in splits["test"]]
    assert not {r["question"] for r in splits["train"]} & {r["question"] for r in splits["test"]}
    # A winning trace takes four decisions, each a different kind, the right tag changing from one to the next.
    for row in winning["train"] + winning["test"]:
        assert [(d["kind"], d["wins"]) for d in row["decisions"]] == [
            ("look_up", True), ("compute", True), ("look_up_again", True), ("answer", True)]
        assert [row["trace"][d["start"]:d["end"]] for d in row["decisions"]] == [
            TOOL_TAGS["search"][0], TOOL_TAGS["python"][0], TOOL_TAGS["search"][0], TOOL_TAGS["answer"][0]]
        assert extract_answer(row["trace"]) == row["answer"]


def test_every_trace_that_loses_a_decision_gets_no_right_answer(splits):
    for row in splits["train"] + splits["test"]:
        if all(d["wins"] for d in row["decisions"]):
            assert len(row["decisions"]) == 4 and extract_answer(row["trace"]) == row["answer"]
        else:
            assert extract_answer(row["trace"]) != row["answer"]


def test_each_decision_loses_at_the_configured_rate_by_both_losing_tags_alike(splits):
    rows = splits["train"]
    for n in range(relay.N_DECISIONS):
        # A trace reaches decision n when every earlier one won; it loses there for p_lose of them.
        reaching = [r for r in rows if len(r["decisions"]) > n and all(d["wins"] for d in r["decisions"][:n])]
        lost = Counter(r["decisions"][n]["kind"] for r in reaching if not r["decisions"][n]["wins"])
        assert sum(lost.values()) == round(0.5 * len(reaching))
        kinds = {kind for kind, wins in relay.KINDS[n].values() if not wins}
        assert set(lost) == kinds if len(kinds) > 1 else lost.keys() <= kinds
        if n == 3:  # both extra calls are the same kind, by tag: about half each
            tags = Counter(r["trace"][r["decisions"][n]["start"]:r["decisions"][n]["end"]] for r in reaching
                           if not r["decisions"][n]["wins"])
            assert min(tags.values()) >= 0.3 * sum(tags.values())


def test_every_observation_in_a_trace_is_what_the_environment_returns(splits):
    """The search the data config's runs get (the lockers, not the two-hop world) and the real
    sandbox reproduce every observation of a sample of traces, winning and losing."""
    tools = environment_tools(["python", "search"], ToolsConfig(python_timeout=5.0, search_k=3), seed=0, tasks=CONFIG["tasks"])
    sample = [r for r in splits["train"] if any(not d["wins"] and d["kind"] == "wrong_tool" for d in r["decisions"])][:6]
    sample += [r for r in splits["train"] if all(d["wins"] for d in r["decisions"])][:2]
    calls = 0
    for row in sample:
        for tool, argument, observation in CALL.findall(row["trace"]):
            if observation:  # a fourth call ends the trace unanswered: the agent loop refuses it
                assert format_observation(tools[tool](argument)) == observation, (row["id"], tool, argument)
                calls += 1
    assert calls >= 12
    # Each wrong tool's observation shows the dead end.
    for row in sample:
        for d in row["decisions"]:
            if d["kind"] == "wrong_tool":
                shown = row["trace"][d["end"]:].split("</result>", 1)[0]
                assert ("NameError" in shown) if row["trace"][d["start"]:d["end"]] == TOOL_TAGS["python"][0] else \
                    ("No search results found." in shown)


def test_a_locker_search_finds_its_own_passage_alone_and_other_data_keeps_the_two_hop_world():
    tool = relay.search_tool(0)
    world = relay.lockers(0)
    for key in (10, 47, 199):
        assert tool(f"L{key}") == f"Page 1: Locker L{key} holds K{world[key]}."
    assert tool("82 + 17") == "No search results found."  # the wrong tool's dead end: no passage holds a bare number
    forks = environment_tools(["search"], ToolsConfig(python_timeout=5.0, search_k=3), seed=0, tasks=["arith_fork", "search_fork"])["search"]
    assert "Locker" not in forks("L47") and forks("L47") == environment_tools(["search"], ToolsConfig(python_timeout=5.0, search_k=3), seed=0)["search"]("L47")


def test_the_tiny_preset_leaves_no_tool_call_to_waste():
    """The relay needs three calls; the tiny preset allows three, so a wrong tool cannot be
    made good by calling the right one afterwards."""
    preset = yaml.safe_load((ROOT / "configs" / "preset" / "tiny.yaml").read_text())
    winning = relay.generate(seed=0, n_train=0, n_test=1, p_lose=0.0)["test"][0]["trace"]
    assert preset["rl"]["agent"]["max_tool_calls"] == len(CALL.findall(winning)) == 3


def test_relay_hard_is_the_relay_with_its_own_name_and_a_lower_start():
    hard_config = yaml.safe_load((ROOT / "configs" / "data" / "relay-hard.yaml").read_text())
    assert hard_config["tasks"] == ["relay_hard"] and hard_config["task_options"]["p_lose"] == 0.75
    hard = get_task("relay_hard")
    assert has_decisions("relay_hard") and hard.N_DECISIONS == relay.N_DECISIONS and hard.corpus(0) == relay.corpus(0)
    rows, same = hard.generate(seed=0, n_train=400, n_test=60), relay.generate(seed=0, n_train=400, n_test=60, p_lose=0.75)
    # Its ids name it (the credit lab finds a problem's task by its id's first part); nothing else differs.
    assert all(row["id"].startswith("relay_hard-") for row in rows["train"] + rows["test"])
    strip = lambda split: [{**row, "id": row["id"].split("-", 1)[1]} for row in split]  # noqa: E731
    assert {s: strip(rows[s]) for s in rows} == {s: strip(same[s]) for s in same}
    # Its first decision loses three times in four, so its SFT policy starts lower than the relay's.
    lost = sum(not row["decisions"][0]["wins"] for row in rows["train"])
    assert lost == round(0.75 * len(rows["train"]))
