"""Every training run and evaluation folder keeps provenance.json (config, overrides, versions,
git commit), which never enters run or sample identity; W&B runs are named, grouped, typed and
tagged. The entry points run as subprocesses on the smoke preset, with ``wandb.init`` recorded."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbpo.provenance import git_state, write_provenance

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
KEY = "smoke/tiny/mix/seed0"
SFT = Path(f"runs/{KEY}/sft")
RL = Path(f"runs/{KEY}/cbpo-eta0")
EVAL = Path(f"results/raw/{KEY}/sft/arith")
SFT_ARGS = ("stage=sft", "preset=smoke")
EVAL_ARGS = ("preset=smoke", "method=sft", "benchmark=arith", "evaluation.limit=2")


# The entry point as `python -m MODULE ARGS`, with wandb.init replaced by a recorder that
# appends each call's keyword arguments (and each run's logged records) to a JSONL file.
RECORDED = """
import json, runpy, sys, wandb

CALLS = sys.argv[1]

def write(record):
    with open(CALLS, "a") as f:
        f.write(json.dumps(record) + "\\n")

class Run:
    def log(self, record, step=None):
        write({"log": record})

    def finish(self):
        pass

def init(**kwargs):
    write({"init": {k: v for k, v in kwargs.items() if k != "config"}})
    return Run()

wandb.init = init
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def entry(work, module, *overrides):
    """Run ``module`` in ``work``; its output and the W&B calls it made."""
    calls = work / "wandb_calls.jsonl"
    calls.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-c", RECORDED, str(calls), module, *overrides], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Task files and the tiny model, an SFT run, one RL step of a CBPO variant and an
    evaluation of the SFT row; the W&B calls each made."""
    from cbpo.data import load_split
    from cbpo.tasks import generate_task
    from cbpo.models import prepare_model

    work = tmp_path_factory.mktemp("provenance")
    texts = []
    for task in ("arith", "twohop"):
        generate_task(task, work / "data", seed=0, n_train=40, n_test=10)
        texts += [t for row in load_split({"tasks": [task]}, work / "data", "train") for t in (row["question"], row["trace"])]
    prepare_model("tiny", work / "models" / "tiny", corpus_texts=texts, seed=0)
    calls = {
        "sft": entry(work, "cbpo.train", *SFT_ARGS)[1],
        "rl": entry(work, "cbpo.train", "stage=rl", "preset=smoke", "method.eta=0", "rl.steps=1")[1],
        "eval": entry(work, "eval.run", *EVAL_ARGS)[1],
    }
    return work, calls


def head_commit():
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def read(path: Path):
    return json.loads(path.read_text())


def test_training_and_evaluation_folders_record_config_overrides_versions_and_commit(study):
    work, _ = study
    for folder, overrides, stage in ((SFT, list(SFT_ARGS), "sft"), (EVAL, list(EVAL_ARGS), "rl")):
        record = read(work / folder / "provenance.json")
        assert record["overrides"] == overrides
        assert record["config"]["stage"] == stage and record["config"]["preset_name"] == "smoke"
        assert "${" not in json.dumps(record["config"])  # resolved, as the job saw it
        assert {"python", "torch", "transformers", "hydra-core", "omegaconf", "numpy"} <= set(record["versions"])
        assert record["git"]["commit"] == head_commit()
        assert record["git"]["commit"] is None or (len(record["git"]["commit"]) == 40 and isinstance(record["git"]["dirty"], bool))
        assert record["host"] and record["time"].endswith("+00:00")
    assert read(work / RL / "provenance.json")["overrides"] == ["stage=rl", "preset=smoke", "method.eta=0", "rl.steps=1"]
    assert (work / EVAL / "summary.json").is_file()


def test_wandb_runs_are_named_grouped_typed_and_tagged(study):
    work, calls = study
    expected = {
        "sft": ("sft-seed0", "sft", ["sft", "smoke"]),
        "rl": ("cbpo-eta0-seed0", "rl", ["cbpo-eta0", "smoke"]),
        "eval": ("sft-seed0", "eval", ["sft", "smoke", "arith"]),
    }
    for job, (name, job_type, tags) in expected.items():
        init = calls[job][0]["init"]
        assert (init["name"], init["job_type"], init["tags"]) == (name, job_type, tags)
        assert init["group"] == "smoke/tiny/mix" and init["project"] == "cbpo"
    init, logged = calls["eval"][0]["init"], [c["log"] for c in calls["eval"][1:]]
    assert init["dir"] == str(EVAL)  # the offline run lands in the evaluation folder
    summary = read(work / EVAL / "summary.json")
    assert logged == [{"pass@1": summary["pass@1"], "mean_tokens": summary["mean_tokens"],
                       "mean_tool_calls": summary["mean_tool_calls"], "problems": 2}]


def test_provenance_stays_out_of_run_and_sample_identity(study):
    work, _ = study
    key, identity = (work / SFT / "run_key.json").read_text(), (work / EVAL / "identity.json").read_text()
    samples = (work / EVAL / "samples.jsonl").read_text()
    assert "provenance" not in key + identity and "versions" not in key + identity
    for folder in (SFT, EVAL):
        record = read(work / folder / "provenance.json")
        record.update(git={"commit": "0" * 40, "dirty": True}, host="elsewhere")  # as if other code made it elsewhere
        (work / folder / "provenance.json").write_text(json.dumps(record))
    out, _ = entry(work, "cbpo.train", *SFT_ARGS)
    assert "already finished" in out
    assert read(work / SFT / "provenance.json")["host"] == "elsewhere"  # a finished run keeps the record of who made it
    out, _ = entry(work, "eval.run", *EVAL_ARGS)
    assert "regenerating" not in out
    assert (work / SFT / "run_key.json").read_text() == key
    assert (work / EVAL / "identity.json").read_text() == identity and (work / EVAL / "samples.jsonl").read_text() == samples


def test_outside_a_git_checkout_or_without_git_the_commit_is_null(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on this PATH
    path = write_provenance(tmp_path / "run", OmegaConf.create({"seed": 0}), ["seed=0"])
    record = read(path)
    assert record["git"] == {"commit": None, "dirty": None} and record["config"] == {"seed": 0}
    assert not list(tmp_path.joinpath("run").glob("*.tmp"))
