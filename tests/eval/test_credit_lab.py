from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cbpo.chat import split_observations
from cbpo.data import task_file, write_jsonl
from cbpo.models import train_tokenizer
from cbpo.tasks import arith_fork, twohop_fork
from eval import credit_lab


@pytest.fixture(scope="module")
def data():
    return {"arith_fork": arith_fork.generate(0, 8, 2, p_lose=0.5)["train"],
            "twohop_fork": twohop_fork.generate(0, 8, 3, p_lose=0.5)["train"]}


@pytest.fixture(scope="module")
def tok(data):
    texts = [text for rows in data.values() for r in rows for text in (r["question"], r["trace"])]
    return train_tokenizer(texts * 4, bpe_vocab=400)


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def pick(rows, wins):
    return next(r for r in rows if r["decisions"][0]["wins"] == wins)


def dump_row(tok, row, advantage, decision, **more):
    """A rollout as the trainer dumps it; ``decision``: its decision's model-token indices,
    which get entropy 2.0 (other model tokens 1.0)."""
    ids, mask = [], []
    for text, is_model in split_observations(row["trace"]):
        piece = encode(tok, text)
        ids, mask = ids + piece, mask + [int(is_model)] * len(piece)
    assert tok.decode(ids, skip_special_tokens=False) == row["trace"]
    n = sum(mask)
    model_entropy = np.where(np.isin(np.arange(n), decision), 2.0, 1.0)
    entropy = np.zeros(len(ids))
    entropy[np.flatnonzero(mask)] = model_entropy
    return {"problem": row["id"], "kind": "parent", "parent": None, "at": None, "reward": 0.0, "text": row["trace"],
            "response_ids": ids, "model_mask": mask, "entropy": entropy.tolist(), "advantage": list(advantage(n)),
            "loss_mask": [1] * n, "tool_calls": 0, "finish": "answer", **more}


def test_span_tokens_match_the_tokenizers_own_offsets(tok):
    text = "Sinu asks: Who is the mayor of Bire?\u200b <search>Bire</search> caf\u00e9"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    assert tok.decode(ids) == text
    for start, end in [(0, 4), (2, 3), (30, 36), (36, 38), (39, 47), (47, 51), (text.index("é"), len(text))]:
        expected = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < end and e > start]
        assert credit_lab.span_tokens(tok, ids, start, end) == expected, (start, end, text[start:end])


def test_decision_tokens_of_a_query_and_of_an_action_tag(tok, data):
    good = pick(data["twohop_fork"], True)
    subject, _ = twohop_fork.question_names(good["question"])
    name = encode(tok, subject)
    row = dump_row(tok, good, lambda n: np.ones(n), decision=range(1, 1 + len(name)))
    record = credit_lab.rollout_record(row, tok, twohop_fork.decision_spans, good["question"])
    # <search> is one token; the subject's tokens follow it.
    assert record["decision_tokens"] == len(name) == record["entropy_decision_n"]
    assert record["entropy_decision_sum"] == 2.0 * len(name) and record["wins"] and record["sampled"]
    losing = pick(data["arith_fork"], False)
    at = len(encode(tok, losing["trace"][: losing["decisions"][0]["start"]]))
    row = dump_row(tok, losing, lambda n: np.arange(n, dtype=float), decision=[at])
    record = credit_lab.rollout_record(row, tok, arith_fork.decision_spans, losing["question"])
    assert record["decision_tokens"] == 1 and record["mass_decision"] == at and not record["wins"]


@pytest.fixture()
def lab(tmp_path, tok, data):
    """Two runs with hand-made dumps over real fork rows and a tokenizer at <run>/final."""
    data_dir = tmp_path / "data"
    for task, rows in data.items():
        write_jsonl(task_file(data_dir, task, "train"), rows)
    good, misled = pick(data["twohop_fork"], True), pick(data["twohop_fork"], False)
    direct, tool = pick(data["arith_fork"], False), pick(data["arith_fork"], True)
    n_good = len(encode(tok, twohop_fork.question_names(good["question"])[0]))
    n_misled = len(encode(tok, twohop_fork.question_names(misled["question"])[1]))
    at_direct = len(encode(tok, direct["trace"][: direct["decisions"][0]["start"]]))
    at_tool = len(encode(tok, tool["trace"][: tool["decisions"][0]["start"]]))
    runs = {}
    for method in ("grpo", "cbpo"):
        run = runs[method] = tmp_path / "runs" / method
        tok.save_pretrained(run / "final")
        (run / "rollouts").mkdir()
    # GRPO: one advantage per response. Step 1: a good query (A = +1) and a direct answer
    # (A = -0.5); step 2: a tool call (A = +2).
    steps = {1: [dump_row(tok, good, lambda n: np.full(n, 1.0), range(1, 1 + n_good)),
                 dump_row(tok, direct, lambda n: np.full(n, -0.5), [at_direct])],
             2: [dump_row(tok, tool, lambda n: np.full(n, 2.0), [at_tool])]}
    for step, rows in steps.items():
        write_jsonl(run_dump(runs["grpo"], step), rows)
    # CBPO: a misled parent with A = 3 on its decision tokens and 1 elsewhere, branch points at
    # model tokens 0 and 5 (the decision starts at 1), and a branch from 5 that copied the
    # decision (its prefix has no loss); a non-dump file is ignored.
    def parent_adv(n):
        return np.where(np.isin(np.arange(n), range(1, 1 + n_misled)), 3.0, 1.0)

    parent = dump_row(tok, misled, parent_adv, range(1, 1 + n_misled), candidates=[0, 3, 5], chosen=[0, 5])
    branch = dump_row(tok, misled, lambda n: np.full(n, -1.0), range(1, 1 + n_misled), kind="branch", parent=0, at=5)
    branch["loss_mask"] = [0] * 5 + [1] * (len(branch["loss_mask"]) - 5)
    write_jsonl(run_dump(runs["cbpo"], 1), [parent, branch])
    (runs["cbpo"] / "rollouts" / "notes.txt").write_text("not a dump")
    return {"runs": runs, "data_dir": data_dir, "n_good": n_good, "n_misled": n_misled,
            "lengths": {k: sum(r["model_mask"]) for k, r in (("good", steps[1][0]), ("direct", steps[1][1]),
                                                             ("tool", steps[2][0]), ("misled", parent))}}


def run_dump(run, step):
    return run / "rollouts" / f"step_{step:06d}.jsonl"


def test_credit_shares_win_rates_and_branch_distances(lab, tmp_path):
    out = tmp_path / "lab" / "credit"
    argv = ["--runs", str(lab["runs"]["grpo"]), str(lab["runs"]["cbpo"]), "--out", str(out), "--data-dir", str(lab["data_dir"])]
    assert credit_lab.main(argv) == 0
    for suffix in (".md", ".csv", ".png", ".pdf"):
        assert (tmp_path / "lab" / f"credit{suffix}").stat().st_size > 0
    table = pd.read_csv(f"{out}.csv", dtype={"step": str}).set_index(["method", "task", "step"])
    L, g, m = lab["lengths"], lab["n_good"], lab["n_misled"]
    grpo = table.loc[("grpo", "all", "all")]
    assert grpo["decision_token_share"] == pytest.approx((g + 2) / (L["good"] + L["direct"] + L["tool"]))
    assert grpo["abs_adv_share"] == pytest.approx((g + 0.5 + 2) / (L["good"] + 0.5 * L["direct"] + 2 * L["tool"]))
    wins = table["win_rate"]
    assert (wins["grpo", "twohop_fork", "1"], wins["grpo", "arith_fork", "1"], wins["grpo", "arith_fork", "2"]) == (1, 0, 1)
    assert (wins["grpo", "arith_fork", "all"], wins["grpo", "all", "all"]) == (0.5, pytest.approx(2 / 3))
    assert grpo["entropy_decision"] == 2.0 and grpo["entropy_other"] == 1.0
    cbpo = table.loc[("cbpo", "all", "all")]
    # The branch's loss tokens start after the decision: it adds mass and tokens, none on it.
    branch_tokens = L["misled"] - 5
    assert cbpo["abs_adv_share"] == pytest.approx(3 * m / (3 * m + (L["misled"] - m) + branch_tokens))
    assert cbpo["decision_token_share"] == pytest.approx(m / (L["misled"] + branch_tokens))
    assert cbpo["abs_adv_per_decision_token"] == pytest.approx(3.0)
    assert (cbpo["rollouts"], cbpo["decisions_sampled"], cbpo["win_rate"]) == (2, 1, 0.0)
    md = " ".join((tmp_path / "lab" / "credit.md").read_text().split())
    # b - d of the chosen points (-1, 4) and of the candidates (-1, 2, 4); GRPO has none.
    assert "| cbpo | 2 | 0.500 | 0.000 | 1.500 | 3 | 0.333 |" in md and "| grpo | 0 |" not in md


def test_a_run_without_dumps_exits_2_naming_it(lab, tmp_path, capsys):
    bare = tmp_path / "runs" / "gspo"
    (bare / "final").mkdir(parents=True)
    argv = ["--runs", str(lab["runs"]["grpo"]), str(bare), "--out", str(tmp_path / "x"), "--data-dir", str(lab["data_dir"])]
    assert credit_lab.main(argv) == 2
    assert f"run {bare} has no rollout dumps" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.*"))


def test_a_run_of_tasks_without_decisions_exits_2(lab, tmp_path, capsys):
    row = json.loads(run_dump(lab["runs"]["grpo"], 2).read_text())
    write_jsonl(run_dump(lab["runs"]["grpo"], 2), [{**row, "problem": "arith-train-000000"}])
    write_jsonl(run_dump(lab["runs"]["grpo"], 1), [])
    argv = ["--runs", str(lab["runs"]["grpo"]), "--out", str(tmp_path / "x"), "--data-dir", str(lab["data_dir"])]
    assert credit_lab.main(argv) == 2
    assert "no rollout of a task with decisions" in capsys.readouterr().err
