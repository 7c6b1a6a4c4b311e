"""Training runs: what identifies one (and so what a rerun resumes), exact resume after kill -9,
variant folders and one writer per run, through the real entry points on the smoke preset."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.runs import forget_stale_run, run_identity

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
SFT_FINAL = Path("runs/smoke/tiny/mix/seed0/sft/final")
# Weight decay moves the weights even while every reward is 0 (an untrained model), so the
# KL term, the gradients and Adam's moments all carry state a resume has to restore.
RL = ["stage=rl", "preset=smoke", "++rl.weight_decay=0.1", "rl.lr=1e-3"]


def python(*args, cwd, **kwargs):
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def finish(process, timeout=300):
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def run(*args, cwd):
    return finish(python(*args, cwd=cwd))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, prepare):
    """Task files, the prepared tiny model, and that model saved as the finished SFT run."""
    work = tmp_path_factory.mktemp("runs")
    prepare(work, sft=False, env=ENV)
    from cbpo.models import load_model
    from cbpo.runlog import save_checkpoint

    model, tokenizer = load_model(work / "models" / "tiny")
    save_checkpoint(work / SFT_FINAL, model, tokenizer, {"step": "final"})
    return work


def _wait_for(path: Path, process, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "the run ended before its checkpoint was seen"
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _comparable(run_dir: Path):
    """Metrics without wall-time keys, and every step's rollout dump."""
    metrics = [{k: v for k, v in json.loads(line).items() if "seconds" not in k and "tok/s" not in k}
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    dumps = {p.name: p.read_text() for p in sorted((run_dir / "rollouts").glob("*.jsonl"))}
    return metrics, dumps


def test_run_killed_after_a_checkpoint_resumes_exactly(workdir):
    steps = ["rl.steps=6", "rl.checkpoint_every=1"]
    whole = python("-m", "cbpo.train", *RL, *steps, "out=U", cwd=workdir)
    killed = python("-m", "cbpo.train", *RL, *steps, "out=K", cwd=workdir)
    _wait_for(workdir / "K" / "step_000002" / "DONE.json", killed)
    killed.kill()
    killed.wait()
    assert not (workdir / "K" / "final").exists()
    rc, out = run("-m", "cbpo.train", *RL, *steps, "out=K", cwd=workdir)
    assert rc == 0 and "resuming from K/step_00000" in out, out[-3000:]
    rc, out = finish(whole)
    assert rc == 0, out[-3000:]
    metrics, dumps = _comparable(workdir / "U")
    assert len(metrics) == len(dumps) == 6 and any(m["kl"] > 0 for m in metrics)
    assert _comparable(workdir / "K") == (metrics, dumps)


def test_method_override_trains_and_evaluates_its_own_variant(workdir):
    default = workdir / "runs/smoke/tiny/mix/seed0/cbpo/final"
    default.mkdir(parents=True)
    (default / "DONE.json").write_text("{}\n")  # the default CBPO run, finished
    rc, out = run("-m", "cbpo.train", *RL, "method=cbpo", "method.eta=0", "rl.steps=1", cwd=workdir)
    assert rc == 0 and "already finished" not in out, out[-3000:]
    assert (workdir / "runs/smoke/tiny/mix/seed0/cbpo-eta0/final/DONE.json").is_file()
    rc, out = run("-m", "eval.run", "preset=smoke", "method.eta=0", "evaluation.limit=2", cwd=workdir)
    assert rc == 0, out[-3000:]
    evaluated = workdir / "results/raw/smoke/tiny/mix/seed0/cbpo-eta0/arith"
    assert (evaluated / "summary.json").is_file()
    assert json.loads((evaluated / "identity.json").read_text())["checkpoint"] == "runs/smoke/tiny/mix/seed0/cbpo-eta0/final"


def test_second_trainer_fails_naming_the_holder_and_a_dead_holders_lock_is_taken_over(workdir):
    out_dir = workdir / "runs/smoke/tiny/mix/seed0/grpo"
    holder = python("-c", f"from cbpo.runs import WriterLock; WriterLock({str(out_dir)!r}); print('held', flush=True); "
                          "import time; time.sleep(600)", cwd=workdir)
    assert holder.stdout.readline().strip() == "held"
    rc, out = run("-m", "cbpo.train", *RL, "method=grpo", "rl.steps=1", cwd=workdir)
    assert rc != 0 and f"process {holder.pid}" in out, out[-3000:]
    assert not (out_dir / "final").exists()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    rc, out = run("-m", "cbpo.train", *RL, "method=grpo", "rl.steps=1", cwd=workdir)
    assert rc == 0, out[-3000:]
    assert (out_dir / "final" / "DONE.json").is_file()


def _identity(overrides, rows, init):
    schema.register()
    with initialize_config_dir(str(ROOT / "configs"), version_base=None):
        return run_identity(compose("config", ["stage=rl", "preset=smoke", *overrides]), rows, init)


def test_settings_that_do_not_change_weights_keep_the_run(workdir, tmp_path):
    rows = [{"id": "a", "question": "1 + 1?", "answer": "2", "domain": "math"}]
    init = workdir / SFT_FINAL
    base = _identity([], rows, init)
    out = tmp_path / "run"
    out.mkdir()
    forget_stale_run(out, base)
    (out / "step_000003").mkdir()
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    os.utime(init / "DONE.json")  # re-touching the start checkpoint changes nothing it holds
    elsewhere = ["evaluation.limit=7", "wandb.enabled=false", "paths.results_dir=x", "paths.runs_dir=y",
                 "benchmark=twohop", "rl.checkpoint_every=5", "rl.dump_rollouts=false"]
    forget_stale_run(out, _identity(elsewhere, rows, init))
    assert (out / "step_000003").is_dir() and (out / "metrics.jsonl").is_file()
    for changed, changed_rows in [(["rl.lr=0.5"], rows), (["method.eta=0"], rows), ([], rows * 2), (["dtype=bfloat16"], rows)]:
        assert _identity(changed, changed_rows, init) != base
    forget_stale_run(out, _identity(["rl.lr=0.5"], rows, init))
    assert not (out / "step_000003").exists() and not (out / "metrics.jsonl").exists()


def test_identity_follows_the_start_checkpoints_weights_not_its_path(workdir, tmp_path):
    from cbpo.models import load_model
    from cbpo.runlog import save_checkpoint

    rows = [{"id": "a", "question": "q", "answer": "1"}]
    model, tokenizer = load_model(workdir / SFT_FINAL)
    save_checkpoint(tmp_path / "same", model, tokenizer, {"step": "final"})
    model.model.embed_tokens.weight.data[0, 0] += 1.0
    save_checkpoint(tmp_path / "other", model, tokenizer, {"step": "final"})
    base = _identity([], rows, workdir / SFT_FINAL)
    assert _identity([], rows, tmp_path / "same") == base
    assert _identity([], rows, tmp_path / "other") != base


def test_a_finished_run_of_other_settings_is_refused_not_overwritten(tmp_path):
    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    forget_stale_run(out, {"rl": {"lr": 1}})
    (out / "final" / "DONE.json").write_text("{}\n")
    forget_stale_run(out, {"rl": {"lr": 1}})  # same settings: nothing to say
    with pytest.raises(RuntimeError, match="other settings.*rl.*variant="):
        forget_stale_run(out, {"rl": {"lr": 2}})
    assert (out / "final" / "DONE.json").is_file()
