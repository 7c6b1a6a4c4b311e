from __future__ import annotations

import re

import pytest

from cbpo.chat import format_observation
from cbpo.tasks import get_task, twohop

TRACE = re.compile(
    r"<think>(?P<plan>[^<]+)</think><search>(?P<q1>[^<]+)</search>(?P<r1><result>.*?</result>)"
    r"<think>(?P<note>[^<]+)</think><search>(?P<q2>[^<]+)</search>(?P<r2><result>.*?</result>)"
    r"<answer>The answer is \\boxed\{(?P<answer>[^}]+)\}</answer>",
    re.DOTALL,
)


@pytest.fixture(scope="module")
def splits():
    return twohop.generate(seed=0, n_train=120, n_test=40)


def _start(row: dict) -> str:
    return TRACE.fullmatch(row["trace"])["q1"]


def test_registered_task_and_row_schema(splits):
    assert get_task("twohop") is twohop
    assert (len(splits["train"]), len(splits["test"])) == (120, 40)
    rows = splits["train"] + splits["test"]
    for row in rows:
        assert set(row) == {"id", "question", "answer", "domain", "trace"}
        assert row["domain"] == "search" and isinstance(row["answer"], str) and row["question"].endswith("?")
    assert len({row["id"] for row in rows}) == len(rows)


def test_same_seed_same_world_other_seed_other_world():
    assert twohop.corpus(3) == twohop.corpus(3)
    assert twohop.corpus(3) != twohop.corpus(4)
    assert twohop.generate(3, 10, 5) == twohop.generate(3, 10, 5)
    passages = twohop.corpus(3)
    assert all(set(p) == {"id", "title", "text"} for p in passages)
    assert len({p["title"] for p in passages}) == len(passages)  # one passage per unique name


def test_splits_share_no_question_and_no_start_entity(splits):
    train, test = splits["train"], splits["test"]
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert not {_start(r) for r in train} & {_start(r) for r in test}


def test_traces_replay_the_bm25_environment(splits):
    tool = twohop.search_tool(0, k=3)
    for row in splits["train"][:40] + splits["test"][:20]:
        match = TRACE.fullmatch(row["trace"])
        assert match, row["trace"]
        assert match["q1"] in row["question"] and match["q2"] not in row["question"]
        assert match["r1"] == format_observation(tool(match["q1"]))
        assert match["r2"] == format_observation(tool(match["q2"]))
        assert len(re.findall(r"^Page \d+: ", match["r1"], re.MULTILINE)) <= 3
        assert match["answer"] == row["answer"] and row["answer"] in match["r2"]
        assert match["q2"] in match["r1"] and match["q2"] in match["note"]


def test_answers_follow_the_world_relations(splits):
    w = twohop.world(0)
    passage = {p["title"]: p["text"] for p in twohop.corpus(0)}
    for row in splits["train"]:
        match = TRACE.fullmatch(row["trace"])
        start, bridge = match["q1"], match["q2"]
        chain = next(c for c in twohop.CHAINS if row["id"].startswith(f"twohop-0-{c.name}-"))
        assert chain.question.format(start=start) == row["question"]
        assert chain.hop1(w, start) == bridge and chain.hop2(w, bridge) == row["answer"]
        # Each hop is stated in the passage of the entity searched for.
        assert re.search(rf"\b{bridge}\b", passage[start])
        assert re.search(rf"\b{row['answer']}\b", passage[bridge])


def test_at_least_three_relation_chains_are_used(splits):
    chains = {c.name for c in twohop.CHAINS for r in splits["train"] if f"-{c.name}-" in r["id"]}
    assert len(twohop.CHAINS) >= 5 and len(chains) >= 3


def test_k_sets_the_pages_per_observation():
    rows = twohop.generate(seed=1, n_train=15, n_test=0, k=1)["train"]
    assert all(len(re.findall(r"^Page \d+: ", TRACE.fullmatch(r["trace"])["r2"], re.MULTILINE)) == 1
               for r in rows)


def test_impossible_requests_name_the_limit():
    with pytest.raises(ValueError, match="questions; asked for n_train=100000"):
        twohop.generate(0, 100_000, 10)
    with pytest.raises(ValueError, match="must be >= 0"):
        twohop.generate(0, -1, 10)
