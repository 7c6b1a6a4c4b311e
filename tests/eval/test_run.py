"""An evaluation output holds samples of one checkpoint and one set of sampling settings, and
has one writer (``python -m eval.run`` as a real subprocess, tiny random checkpoints)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cbpo import schema
from eval.run import eval_identity

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The arith task files and two finished checkpoints, A and B, of different weights."""
    from cbpo.data import load_split
    from cbpo.tasks import generate_task
    from cbpo.models import load_model, prepare_model
    from cbpo.runlog import save_checkpoint

    work = tmp_path_factory.mktemp("eval")
    generate_task("arith", work / "data", seed=0, n_train=40, n_test=10)
    texts = [t for row in load_split({"tasks": ["arith"]}, work / "data", "train") for t in (row["question"], row["trace"])]
    for name, seed in (("A", 0), ("B", 1)):
        prepare_model("tiny", work / "models" / name, corpus_texts=texts, seed=seed)
        model, tokenizer = load_model(work / "models" / name)
        save_checkpoint(work / name, model, tokenizer, {"step": "final"})
    return work


def evaluate(workdir, checkpoint, eval_out):
    command = [sys.executable, "-m", "eval.run", "preset=smoke", "evaluation.limit=3",
               f"checkpoint={checkpoint}", f"eval_out={eval_out}"]
    done = subprocess.run(command, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def samples(path: Path):
    return [json.loads(line)["trajectory"] for line in (path / "samples.jsonl").read_text().splitlines()]


def test_another_checkpoint_into_the_same_output_regenerates(workdir):
    rc, out = evaluate(workdir, "A", "X")
    assert rc == 0, out[-3000:]
    from_a = samples(workdir / "X")
    rc, out = evaluate(workdir, "B", "X")
    assert rc == 0, out[-3000:]
    assert "regenerating" in out and "'A'" in out and "'B'" in out
    rc, out = evaluate(workdir, "B", "Y")
    assert rc == 0, out[-3000:]
    assert samples(workdir / "X") == samples(workdir / "Y") != from_a


def test_second_evaluation_fails_naming_the_holder_and_a_dead_holders_lock_is_taken_over(workdir):
    holder = subprocess.Popen(
        [sys.executable, "-c", "from cbpo.runs import WriterLock; WriterLock('Z'); print('held', flush=True); "
                               "import time; time.sleep(600)"],
        cwd=workdir, env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    rc, out = evaluate(workdir, "A", "Z")
    assert rc != 0 and f"process {holder.pid}" in out, out[-3000:]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    rc, out = evaluate(workdir, "A", "Z")
    assert rc == 0, out[-3000:]
    assert (workdir / "Z" / "summary.json").is_file()


def test_identity_covers_what_changes_samples_not_which_exist(workdir):
    def identity(*overrides, checkpoint="A"):
        schema.register()
        with initialize_config_dir(str(ROOT / "configs"), version_base=None):
            return eval_identity(compose("config", ["preset=smoke", *overrides]), workdir / checkpoint, None)

    base = identity()
    assert identity("evaluation.limit=7", "evaluation.n_samples=4", "evaluation.batch_size=2") == base
    for changed in ("evaluation.temperature=1.0", "rl.agent.max_new_tokens=9", "seed=3", "benchmark=twohop",
                    "tools_cfg.search_k=1", "judge_fallback=em", "dtype=bfloat16"):
        assert identity(changed) != base, changed
    assert identity(checkpoint="B")["fingerprint"] != base["fingerprint"]


def test_rows_without_training_evaluate_the_folder_and_prompt_they_name(workdir):
    # base / tir: the prepared model (models_dir/<model>) without / with the tool prompt;
    # sft: the init checkpoint with the run's prompt. No training step is needed.
    (workdir / "prepared").mkdir(exist_ok=True)
    if not (workdir / "prepared" / "tiny").exists():
        (workdir / "prepared" / "tiny").symlink_to(workdir / "models" / "A")
    seen = {}
    for row, extra in (("base", []), ("tir", []), ("sft", ["init=B"])):
        command = [sys.executable, "-m", "eval.run", "preset=smoke", "evaluation.limit=2", f"method={row}",
                   "paths.models_dir=prepared", f"eval_out=rows/{row}", *extra]
        done = subprocess.run(command, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        seen[row] = json.loads((workdir / "rows" / row / "identity.json").read_text())
    assert seen["base"]["checkpoint"] == seen["tir"]["checkpoint"] == "prepared/tiny"
    assert seen["sft"]["checkpoint"] == "B"
    assert seen["base"]["system_prompt"] is None and "python" in seen["tir"]["system_prompt"]
    assert seen["sft"]["system_prompt"] is None  # the smoke preset's run prompt is "none"


def test_a_row_without_training_cannot_be_trained(workdir):
    done = subprocess.run([sys.executable, "-m", "cbpo.train", "stage=rl", "method=tir", "preset=smoke"],
                          cwd=workdir, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "does not train" in done.stderr and "eval.run method=tir" in done.stderr
