from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cbpo.chat import split_observations
from cbpo.data import task_file, write_jsonl
from cbpo.models import train_tokenizer
from cbpo.tasks import arith_fork, relay, search_chain, search_fork
from eval import credit_lab


@pytest.fixture(scope="module")
def data():
    return {"arith_fork": arith_fork.generate(0, 8, 2, p_lose=0.5)["train"],
            "search_fork": search_fork.generate(0, 8, 3, p_lose=0.5)["train"]}


@pytest.fixture(scope="module")
def tok(data):
    texts = [text for rows in data.values() for r in rows for text in (r["question"], r["trace"])]
    return train_tokenizer(texts * 4, bpe_vocab=400)


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def pick(rows, wins):
    return next(r for r in rows if r["decisions"][0]["wins"] == wins)


def decision_at(tok, row):
    """The model-token index of a trace's decision: an atomic action tag before any observation."""
    return len(encode(tok, row["trace"][: row["decisions"][0]["start"]]))


def dump_row(tok, row, advantage, decision, p_taken=None, **more):
    """A rollout as the trainer dumps it; ``decision``: its decision's model-token indices,
    which get entropy 2.0 (other model tokens 1.0). With ``p_taken``, the dump holds log-probs:
    log(p_taken) at the decision's first token, log(0.5) at the other model tokens (older dumps
    hold none)."""
    ids, mask = [], []
    for text, is_model in split_observations(row["trace"]):
        piece = encode(tok, text)
        ids, mask = ids + piece, mask + [int(is_model)] * len(piece)
    assert tok.decode(ids, skip_special_tokens=False) == row["trace"]
    n = sum(mask)
    model_entropy = np.where(np.isin(np.arange(n), decision), 2.0, 1.0)
    entropy = np.zeros(len(ids))
    entropy[np.flatnonzero(mask)] = model_entropy
    if p_taken is not None:
        logprob = np.zeros(len(ids))
        logprob[np.flatnonzero(mask)] = np.where(np.arange(n) == decision[0], np.log(p_taken), np.log(0.5))
        more["logprob"] = logprob.tolist()
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


def test_decision_tokens_are_the_first_action_tag(tok, data):
    good = pick(data["search_fork"], True)
    row = dump_row(tok, good, lambda n: np.ones(n), decision=[decision_at(tok, good)])
    record = credit_lab.rollout_record(row, tok, search_fork.decision_spans, good["question"])
    assert record["decision_tokens"] == 1 == record["entropy_decision_n"]
    assert record["entropy_decision_sum"] == 2.0 and record["wins"] and record["sampled"]
    losing = pick(data["arith_fork"], False)
    at = decision_at(tok, losing)
    row = dump_row(tok, losing, lambda n: np.arange(n, dtype=float), decision=[at])
    record = credit_lab.rollout_record(row, tok, arith_fork.decision_spans, losing["question"])
    assert record["decision_tokens"] == 1 and record["mass_decision"] == at and not record["wins"]


def test_p_win_is_the_winning_choices_probability_at_the_first_decision_token(tok, data):
    tool, direct = pick(data["arith_fork"], True), pick(data["arith_fork"], False)
    at_tool, at_direct = decision_at(tok, tool), decision_at(tok, direct)

    def p_win(row, at, **p_taken):
        record = credit_lab.rollout_record(dump_row(tok, row, np.ones, [at], **p_taken), tok, arith_fork.decision_spans,
                                           row["question"])
        return record["p_win"]

    # Winning: the sampled token's own probability; losing: what the other choice had left.
    assert p_win(tool, at_tool, p_taken=0.7) == pytest.approx(0.7)
    assert p_win(direct, at_direct, p_taken=0.2) == pytest.approx(0.8)
    assert np.isnan(p_win(tool, at_tool))


def test_a_chain_rollouts_decisions_are_both_actions_and_branch_points_at_either_count(tok):
    row = next(r for r in search_chain.generate(0, 12, 2, p_lose=0.3)["train"] if len(r["decisions"]) == 2)
    first, second = (sum(len(encode(tok, text)) for text, is_model in split_observations(row["trace"][: d["start"]])
                         if is_model) for d in row["decisions"])
    dump = dump_row(tok, row, np.ones, [first, second], candidates=[first, first + 1, second, second + 2],
                    chosen=[second, first + 1])
    record = credit_lab.rollout_record(dump, tok, search_chain.decision_spans, row["question"])
    assert record["decision_tokens"] == 2 and record["entropy_decision_sum"] == 4.0
    assert record["sampled_2"] and record["wins_2"] and np.isnan(record["p_win_2"])  # no log-probs dumped
    assert record["chosen"] == [second - first, 1] and record["chosen_at_decision"] == [True, False]
    assert record["candidates_at_decision"] == [True, False, True, False]
    table = credit_lab.distance_table({"cbpo": [record]}).iloc[0]
    assert (table["chosen at d"], table["chosen at a decision"], table["candidates at a decision"]) == (0.0, 0.5, 0.5)
    # Any method's branch rollouts: their own boundary against their decisions.
    branches = [credit_lab.rollout_record(dump_row(tok, row, np.ones, [first, second], kind="branch", parent=0, at=at),
                                          tok, search_chain.decision_spans, row["question"]) for at in (second, second + 1)]
    assert [r["branch"] for r in branches] == [[second - first], [second + 1 - first]]
    assert [r["branch_at_decision"] for r in branches] == [[True], [False]] and record["branch"] == []
    # A branch from the second decision samples it; one from after it copied it.
    assert [r["sampled_2"] for r in branches] == [True, False]
    early = next(r for r in search_chain.generate(0, 12, 2, p_lose=0.3)["train"]
                 if [d["wins"] for d in r["decisions"]] == [True, False])
    at = [sum(len(encode(tok, text)) for text, is_model in split_observations(early["trace"][: d["start"]]) if is_model)
          for d in early["decisions"]]
    dump = dump_row(tok, early, np.ones, at, p_taken=0.25)
    dump["logprob"][[i for i, m in enumerate(dump["model_mask"]) if m][at[1]]] = np.log(0.4)
    lost = credit_lab.rollout_record(dump, tok, search_chain.decision_spans, early["question"])
    assert not lost["wins_2"] and lost["p_win_2"] == pytest.approx(0.6)
    assert credit_lab.summarise(pd.DataFrame([lost]))["win_rate_2"] == 0.0
    table = credit_lab.branch_table({"arpo": branches, "grpo": [record]})
    assert table["method"].tolist() == ["arpo"]
    assert (table.iloc[0]["branches"], table.iloc[0]["at a decision"], table.iloc[0]["at d"]) == (2, 0.5, 0.0)


@pytest.fixture()
def lab(tmp_path, tok, data):
    """Two runs with hand-made dumps over real fork rows and a tokenizer at <run>/final."""
    data_dir = tmp_path / "data"
    for task, rows in data.items():
        write_jsonl(task_file(data_dir, task, "train"), rows)
    good, misled = pick(data["search_fork"], True), pick(data["search_fork"], False)
    direct, tool = pick(data["arith_fork"], False), pick(data["arith_fork"], True)
    at = {name: decision_at(tok, row) for name, row in (("good", good), ("misled", misled), ("direct", direct), ("tool", tool))}
    runs = {}
    for method in ("grpo", "cbpo"):
        run = runs[method] = tmp_path / "runs" / method
        tok.save_pretrained(run / "final")
        (run / "rollouts").mkdir()
    # GRPO: one advantage per response. Step 1: a look-up (A = +1, reward 1) and a direct answer
    # (A = -0.5, reward 0); step 2: a tool call (A = +2) whose code went wrong (reward 0).
    steps = {1: [dump_row(tok, good, lambda n: np.full(n, 1.0), [at["good"]], reward=1.0),
                 dump_row(tok, direct, lambda n: np.full(n, -0.5), [at["direct"]])],
             2: [dump_row(tok, tool, lambda n: np.full(n, 2.0), [at["tool"]])]}
    for step, rows in steps.items():
        write_jsonl(run_dump(runs["grpo"], step), rows)
    # CBPO (dumped with log-probs, GRPO without): a parent that trusted the claim, sampling that
    # choice at probability 0.2, with A = 3 on its decision token d and 1 elsewhere, branch
    # points at d - 1 and d + 4, and a branch from d + 4 that copied the decision (its prefix
    # has no loss) and earned reward 1; a non-dump file is ignored.
    d = at["misled"]

    def parent_adv(n):
        return np.where(np.arange(n) == d, 3.0, 1.0)

    parent = dump_row(tok, misled, parent_adv, [d], 0.2, candidates=[d - 1, d + 2, d + 4], chosen=[d - 1, d + 4])
    branch = dump_row(tok, misled, lambda n: np.full(n, -1.0), [d], 0.9, kind="branch", parent=0, at=d + 4, reward=1.0)
    branch["loss_mask"] = [0] * (d + 4) + [1] * (len(branch["loss_mask"]) - d - 4)
    write_jsonl(run_dump(runs["cbpo"], 1), [parent, branch])
    (runs["cbpo"] / "rollouts" / "notes.txt").write_text("not a dump")
    return {"runs": runs, "data_dir": data_dir, "branch_at": d + 4,
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
    L = lab["lengths"]
    grpo = table.loc[("grpo", "all", "all")]
    assert grpo["decision_token_share"] == pytest.approx(3 / (L["good"] + L["direct"] + L["tool"]))
    assert grpo["abs_adv_share"] == pytest.approx((1 + 0.5 + 2) / (L["good"] + 0.5 * L["direct"] + 2 * L["tool"]))
    wins = table["win_rate"]
    assert (wins["grpo", "search_fork", "1"], wins["grpo", "arith_fork", "1"], wins["grpo", "arith_fork", "2"]) == (1, 0, 1)
    assert (wins["grpo", "arith_fork", "all"], wins["grpo", "all", "all"]) == (0.5, pytest.approx(2 / 3))
    assert grpo["entropy_decision"] == 2.0 and grpo["entropy_other"] == 1.0
    # Reward by choice: the tool call was taken and failed, the look-up succeeded.
    reward_win, reward_lose = table["reward_win"], table["reward_lose"]
    assert (reward_win["grpo", "arith_fork", "all"], reward_win["grpo", "search_fork", "all"]) == (0.0, 1.0)
    assert (grpo["reward_win"], grpo["reward_lose"]) == (0.5, 0.0)
    cbpo = table.loc[("cbpo", "all", "all")]
    # The branch's loss tokens start after the decision: it adds mass and tokens, none on it.
    branch_tokens = L["misled"] - lab["branch_at"]
    assert cbpo["abs_adv_share"] == pytest.approx(3 / (3 + (L["misled"] - 1) + branch_tokens))
    assert cbpo["decision_token_share"] == pytest.approx(1 / (L["misled"] + branch_tokens))
    assert cbpo["abs_adv_per_decision_token"] == pytest.approx(3.0)
    assert (cbpo["rollouts"], cbpo["decisions_sampled"], cbpo["win_rate"]) == (2, 1, 0.0)
    # The branch copied its losing decision, and its reward counts for that choice too.
    assert np.isnan(cbpo["reward_win"]) and cbpo["reward_lose"] == 0.5
    # Only the parent sampled its decision; GRPO's dumps predate log-probs.
    assert cbpo["p_win"] == pytest.approx(0.8) and table["p_win"]["cbpo", "search_fork", "1"] == pytest.approx(0.8)
    assert table["p_win"][table.index.get_level_values("method") == "grpo"].isna().all()
    md = " ".join((tmp_path / "lab" / "credit.md").read_text().split())
    # b - d of the chosen points (-1, 4) and of the candidates (-1, 2, 4); GRPO has none.
    # The point before d resamples the decision; the one after it lies below the lost choice.
    assert "| cbpo | 2 | 0.500 | 0.000 | 0.000 | 1.500 | 0.500 | 0.500 | 3 | 0.333 | 0.000 |" in md and "| grpo | 0 |" not in md
    # CBPO's one branch starts 4 tokens after the decision, below its parent's losing choice; GRPO
    # has no branch rows.
    assert "| cbpo | 1 | 0.000 | 0.000 | 0.000 | 4.000 | 0.000 | 1.000 |" in md
    assert (cbpo["branches"], cbpo["branch_resamples"], cbpo["branch_below_failed"]) == (1, 0.0, 1.0)
    assert grpo["branches"] == 0 and np.isnan(grpo["branch_resamples"])
    assert "The dumps of grpo hold no log-probs" in md and "| step | cbpo, search_fork | |---" in md
    # Steps to 0.8 on every decision: GRPO's arith_fork first at step 2; CBPO never (one dumped
    # step: counted as 2), one step behind GRPO's search_fork.
    assert "| grpo | arith_fork | 2 | 2 | |" in md and "| cbpo | search_fork | >1 | 2 | +1.0 |" in md


def test_dumps_without_logprobs_still_write_every_output(lab, tmp_path):
    out = tmp_path / "old" / "credit"
    argv = ["--runs", str(lab["runs"]["grpo"]), "--out", str(out), "--data-dir", str(lab["data_dir"])]
    assert credit_lab.main(argv) == 0
    for suffix in (".md", ".csv", ".png", ".pdf"):
        assert (tmp_path / "old" / f"credit{suffix}").stat().st_size > 0
    assert pd.read_csv(f"{out}.csv")["p_win"].isna().all()
    md = (tmp_path / "old" / "credit.md").read_text()
    assert "The dumps of grpo hold no log-probs" in md and "p_win) per step" not in md and "## Win rate per step" in md


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


def test_relay_decisions_count_only_below_a_prefix_that_has_not_lost(tmp_path):
    """Four decisions: a trace that wins the first and loses the second by a wrong tool has
    decision 2 sampled and lost, decision 3 (the answer after the dead end) not counted; its
    branch points before decision 2 resample it, those after lie below the lost choice. Over two
    seeds, the steps to 0.8 and the per-decision figure."""
    rows = relay.generate(0, 60, 2, p_lose=0.5)["train"]
    tok = train_tokenizer([t for r in rows for t in (r["question"], r["trace"])] * 4, bpe_vocab=400)
    lost = next(r for r in rows if [(d["kind"], d["wins"]) for d in r["decisions"]][:2] == [("look_up", True), ("wrong_tool", False)])
    won = next(r for r in rows if len(r["decisions"]) == 4 and all(d["wins"] for d in r["decisions"]))

    def firsts(row):
        return [sum(len(encode(tok, text)) for text, is_model in split_observations(row["trace"][: d["start"]]) if is_model)
                for d in row["decisions"]]

    at = firsts(lost)
    record = credit_lab.rollout_record(dump_row(tok, lost, lambda n: np.where(np.arange(n) == at[1], -2.0, 0.5), at,
                                                chosen=[at[1], at[1] + 1], candidates=[at[1], at[1] + 1]),
                                       tok, relay.decision_spans, lost["question"])
    assert [record[credit_lab.col("sampled", d)] for d in (1, 2, 3, 4)] == [True, True, False, False]
    assert [record[credit_lab.col("wins", d)] for d in (1, 2)] == [True, False]
    assert (record["credit"], record["credit_2"]) == (0.5, -2.0) and np.isnan(record["credit_3"])
    assert record["chosen_resamples"] == [True, True] and record["chosen_below_failed"] == [False, True]
    good = credit_lab.rollout_record(dump_row(tok, won, np.ones, firsts(won)), tok, relay.decision_spans, won["question"])
    assert all(good[credit_lab.col("sampled", d)] and good[credit_lab.col("wins", d)] for d in (1, 2, 3, 4))
    summary = credit_lab.summarise(pd.DataFrame([record, good]))
    assert (summary["win_rate"], summary["win_rate_2"], summary["win_rate_3"]) == (1.0, 0.5, 1.0)
    assert summary["credit_gap_2"] == 1.0 + 2.0  # the winning choice's tokens got 1, the losing one's -2

    def recs(seed, step, n_good):
        return [{"task": "relay", "seed": seed, "step": step, **r} for r in [record] + [good] * n_good]

    # seed0 reaches 0.8 on every decision at step 2 (1 loss in 5), seed1 only at step 3.
    records = {"grpo": recs("seed0", 1, 1) + recs("seed0", 2, 4) + recs("seed1", 1, 1) + recs("seed1", 2, 2) + recs("seed1", 3, 4),
               "cbpo-alive": recs("seed0", 1, 4) + recs("seed1", 1, 4)}  # a variant: a run name, not a method
    steps = credit_lab.steps_to(credit_lab.accuracy_by_seed(records), 0.8)
    assert steps.set_index(["method", "seed"])["step"].to_dict() == {
        ("grpo", "seed0"): 2, ("grpo", "seed1"): 3, ("cbpo-alive", "seed0"): 1, ("cbpo-alive", "seed1"): 1}
    table = credit_lab.steps_table(steps, 0.8).set_index("method")
    assert table.loc["cbpo-alive", "- grpo"] == "-1.5 ± 6.4" and table.loc["grpo", "steps by seed"] == "2 / 3"
    out = tmp_path / "relay"
    credit_lab.write(records, out, "relay")
    md = (tmp_path / "relay.md").read_text()
    assert "## Decision 4: win rate per step" in md and "## Steps to 0.8 on every decision" in md
    assert (tmp_path / "relay.png").stat().st_size > 0
