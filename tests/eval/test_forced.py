"""``evaluation.forced``: the forced-choice diagnostic of the tasks with decisions (issue #25), as
``python -m eval.run`` runs it (a real subprocess on a tiny random checkpoint)."""
import json
import os
import subprocess
import sys

import pytest

from cbpo.tasks.forks import winning_prefixes
from eval import report

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The chain tasks' files as data=chains writes them, and a finished random checkpoint."""
    from cbpo.tasks import generate_task
    from cbpo.models import load_model, prepare_model
    from cbpo.runlog import save_checkpoint

    work = tmp_path_factory.mktemp("forced")
    texts = []
    for task in ("arith_chain", "search_chain"):
        paths = generate_task(task, work / "data", seed=0, n_train=20, n_test=200, p_lose=0.5)
        texts += [t for line in paths["train"].read_text().splitlines() for t in json.loads(line).values() if isinstance(t, str)]
    prepare_model("tiny", work / "models" / "tiny", corpus_texts=texts, seed=0)
    model, tokenizer = load_model(work / "models" / "tiny")
    save_checkpoint(work / "ckpt", model, tokenizer, {"step": "final"})
    return work


def evaluate(workdir, benchmark, forced, out):
    command = [sys.executable, "-m", "eval.run", "preset=smoke", "data=chains", f"benchmark={benchmark}",
               "evaluation.limit=3", f"evaluation.forced={forced}", "checkpoint=ckpt", f"eval_out={out}"]
    done = subprocess.run(command, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(("benchmark", "forced"), [("arith_chain", 2), ("search_chain", 1)])
def test_each_response_starts_with_the_winning_trace_up_to_the_forced_decision(workdir, benchmark, forced):
    rc, out = evaluate(workdir, benchmark, forced, benchmark)
    assert rc == 0, out[-3000:]
    prefixes = winning_prefixes(benchmark, 0, 200, forced, {"p_lose": 0.5})
    rows = [json.loads(line) for line in (workdir / benchmark / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["trajectory"].startswith(prefixes[row["id"]]), (row["trajectory"][:300], prefixes[row["id"]])
        # the forced prefix's tool calls count against the cap
        assert row["tool_calls"] >= forced - 1
    provenance = json.loads((workdir / benchmark / "provenance.json").read_text())
    assert provenance["config"]["evaluation"]["forced"] == forced


def test_tables_refuse_a_forced_evaluation(tmp_path):
    """A summary whose provenance records evaluation.forced (as eval.run writes it) never
    enters a table."""
    folder = tmp_path / "seed0" / "sft" / "search_chain"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"pass@1": 0.5}))
    (folder / "provenance.json").write_text(json.dumps({"config": {"evaluation": {"forced": 1, "limit": None}}}))
    seed = report.Seed(number=0, summaries=tmp_path / "seed0", runs=None)
    configs = {"search_chain": {"display_name": "SearchChain", "domain": "search"}}
    with pytest.raises(ValueError, match="forced-choice diagnostic"):
        report.seed_cells(seed, "sft", configs, report.Budget("CPU", 1))
    (folder / "provenance.json").write_text(json.dumps({"config": {"evaluation": {"forced": 0, "limit": None}}}))
    cells, _ = report.seed_cells(seed, "sft", configs, report.Budget("CPU", 1))
    assert cells[0]["value"] == 50.0


@pytest.mark.parametrize(("benchmark", "forced", "message"), [
    ("arith", 1, "arith is not one (with decisions: arith_chain, arith_fork, relay, relay_hard, search_chain, search_fork)"),
    ("arith_chain", 3, "fewer than forced=3"),
])
def test_forced_needs_a_task_with_that_many_decisions(workdir, benchmark, forced, message):
    rc, out = evaluate(workdir, benchmark, forced, "bad")
    assert rc != 0 and "invalid setting" in out and message in out, out[-2000:]
    assert "Traceback" not in out


def test_the_forced_table_gives_each_seed_and_the_mean_per_forced_decision(tmp_path, capsys):
    import pandas as pd

    from eval.forced import main

    values = {0: {0: 0.1, 1: 0.3, 2: 0.5}, 1: {0: 0.2, 1: 0.4, 2: 0.7}}
    for seed, by_k in values.items():
        for k, value in by_k.items():
            path = tmp_path / f"seed{seed}" / "sft" / "arith_chain" / (f"forced{k}" if k else "") / "summary.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"pass@1": value}))
    seeds = [str(tmp_path / "seed0"), str(tmp_path / "seed1")]
    out = tmp_path / "tables" / "forced"
    assert main(["--summaries", *seeds, "--benchmarks", "arith_chain=2", "--out", str(out)]) == 0
    table = pd.read_csv(out.with_suffix(".csv"))
    assert table["forced"].tolist() == [0, 1, 2] and set(table["benchmark"]) == {"ArithChain"}
    assert table["seed 1"].tolist() == pytest.approx([20.0, 40.0, 70.0])
    assert table["mean"].tolist() == pytest.approx([15.0, 35.0, 60.0])
    # two seeds: t(1) = 12.706 times the standard error, half the two values' difference
    assert table["ci95"].tolist() == pytest.approx([63.53, 63.53, 127.06], rel=1e-3)
    assert "| ArithChain" in out.with_suffix(".md").read_text()
    assert main(["--summaries", *seeds, "--benchmarks", "arith_chain=3", "--out", str(out)]) == 2
    assert "forced3/summary.json" in capsys.readouterr().err
