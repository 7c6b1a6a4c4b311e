"""The verl backend for real (engine tier): ``python -m cbpo.train stage=rl backend=verl`` on the
smoke preset runs verl 0.9.1's own Ray task runner, FSDP2 actor and vLLM server (the suite's
``SuiteServer``), on CPU through cbpo/backends/verl/cpu.py, and leaves the local trainer's run
layout: ``final/`` with DONE.json, one metrics line per step under the local trainer's keys, and
a run killed with SIGKILL resumes from its last checkpoint."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.engines, pytest.mark.timeout(3600)]
SLOW = pytest.mark.skipif(os.environ.get("CBPO_SLOW") != "1", reason="slow: set CBPO_SLOW=1")

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
       "TOKENIZERS_PARALLELISM": "false"}
RUN_LIMIT_S = 1500
# what the tables and curves read from a metrics line, as the local trainer writes it
LOCAL_KEYS = {"step", "reward", "problems", "rollouts", "generated_tokens", "tool_calls", "tool_seconds", "n_parent",
              "n_branch", "n_fill", "rollout_seconds", "wall_seconds", "pg_loss", "grad_norm", "devices"}


def command(study, method, *overrides, gpus=1):
    root, paths = study
    return [sys.executable, "-m", "cbpo.train", "stage=rl", "backend=verl", f"method={method}",
            f"verl.gpus_per_node={gpus}", *paths, *overrides]


@pytest.fixture(scope="module")
def study(tmp_path_factory, prepare):
    """Smoke data, the scratch model and its SFT checkpoint (local backend), as the DAG makes them."""
    root = tmp_path_factory.mktemp("verl_cpu")
    return root, prepare(root, env=ENV)


def run_dir(study, method) -> Path:
    return study[0] / "runs" / "smoke" / "tiny" / "mix" / "seed0" / method


def train(study, method, *overrides, gpus=1):
    done = subprocess.run(command(study, method, *overrides, gpus=gpus), cwd=study[0], env=ENV, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stderr[-5000:]
    return done


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def check_finished(run: Path, steps: int, rollouts: int | None = 2 * 4, sampler_checked: bool = True) -> list[dict]:
    assert json.loads((run / "final" / "DONE.json").read_text())["step"] == "final"
    assert (run / "final" / "config.json").is_file() and (run / "final" / "tokenizer.json").is_file()
    lines = metrics(run)
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        assert LOCAL_KEYS <= set(m), LOCAL_KEYS - set(m)
        assert m["rollouts"] == rollouts if rollouts else m["rollouts"] > 0  # smoke: 2 problems x budget 4
        assert m["generated_tokens"] > 0
        # the server's prefix-cache counts reach the line (#37 item 2)
        assert m["prefill_tokens"] > 0 and 0 <= m["prefill_cached_tokens"] <= m["prefill_tokens"]
        assert m["prefill_computed_tokens"] == m["prefill_tokens"] - m["prefill_cached_tokens"]
        if sampler_checked:  # vLLM (float32 on CPU) samples the policy the FSDP actor scores
            assert m["rollout_probs_diff_max"] < 1e-3, m["rollout_probs_diff_max"]
    return lines


# Slow tier since the one-step-off runs joined the engine tier: verl's synchronous trainer is the
# CBPO run's below and GRPO's credit on verl the one-step-off GRPO run's, so this run saved ~160 s
@pytest.mark.slow
@SLOW
def test_grpo_trains_on_verls_ray_fsdp_and_vllm_processes(study):
    train(study, "grpo")
    lines = check_finished(run_dir(study, "grpo"), 2)
    print("grpo on verl:", [(m["step"], round(m["wall_seconds"], 1), m["rollout_probs_diff_max"], m["prefill_cached_tokens"],
                             m["prefill_tokens"]) for m in lines])


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launch and everything it started (Ray's processes included)."""
    try:
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:  # it ended on its own: the caller's checks say whether too early
        tree = []
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


# Four steps, where smoke has two: a smoke step can take under a second, and the kill must land
# between the first checkpoint and the end (both runs: the step count is part of the run's identity).
KILLED_RUN = ("rl.steps=4",)


def test_cbpo_trains_on_verl_and_a_killed_run_resumes_from_its_checkpoint(study):
    run = run_dir(study, "cbpo")
    latest = run / "verl" / "latest_checkpointed_iteration.txt"  # verl writes it once a checkpoint is whole
    proc = subprocess.Popen(command(study, "cbpo", *KILLED_RUN), cwd=study[0], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + RUN_LIMIT_S
    try:
        while not (latest.is_file() and latest.read_text().strip() == "1"):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.1)
    finally:
        kill_tree(proc)
    assert not (run / "final").exists(), "the run finished before it was killed"
    first = metrics(run)
    assert first[0]["step"] == 1

    train(study, "cbpo", *KILLED_RUN)
    lines = check_finished(run, 4)
    assert lines[0] == first[0]  # step 1 came from the checkpoint, not trained again
    print("cbpo on verl:", [(m["step"], m["n_branch"], round(m["wall_seconds"], 1), m["rollout_probs_diff_max"],
                             m["prefill_cached_tokens"], m["prefill_tokens"]) for m in lines])


@pytest.mark.parametrize("method", ["grpo", "cbpo"])
def test_one_step_off_policy_trains_with_the_servers_on_a_gpu_of_their_own(study, method):
    # #37 item 4: rl.async_training=one_step_off is verl's one-step-off-policy trainer; the actor
    # and the vLLM server each on one fake GPU, weights pushed over cpu.py's gloo checkpoint
    # engine. CBPO with kappa=0: the smoke model branches (under the paper's kappa it never does)
    name = f"{method}-one-step-off"
    kappa = ["method.kappa=0"] if method == "cbpo" else []
    train(study, method, "rl.async_training=one_step_off", "verl.async_rollout_gpus=1", f"run_name={name}", *kappa,
          gpus=2)
    # PPO's old log-probs are the servers' own (verl's bypass mode): no actor rescoring to compare
    lines = check_finished(run_dir(study, name), 2, sampler_checked=False)
    assert all(m["devices"] == 2 and m["generate_seconds"] > 0 for m in lines)  # the trainer's own timer
    assert "rollout_probs_diff_max" not in lines[0]
    if method == "cbpo":
        assert sum(m["n_branch"] for m in lines) > 0
    print(f"{name} on verl:", [(m["step"], m["n_branch"], round(m["rollout_seconds"], 1), round(m["generate_seconds"], 1),
                               round(m["wall_seconds"], 1)) for m in lines])


def test_sft_trains_with_verls_fsdp_sft_trainer_into_the_local_backends_final(study):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, paths = study
    runs = root / "runs_verl_sft"
    args = [p for p in paths if not p.startswith("paths.runs_dir=")] + [f"paths.runs_dir={runs}"]
    done = subprocess.run([sys.executable, "-m", "cbpo.train", "stage=sft", "backend=verl", "verl.gpus_per_node=1",
                           *args], cwd=root, env=ENV, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stderr[-5000:]
    run = runs / "smoke" / "tiny" / "mix" / "seed0" / "sft"
    assert json.loads((run / "final" / "DONE.json").read_text())["step"] == "final"
    (line,) = metrics(run)  # smoke: 3 steps, logged at the last
    assert line["step"] == 3 and 0 < line["sft_loss"] < 20 and line["tokens"] > 0
    init = root / "models" / "tiny"
    trained = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    prepared = AutoModelForCausalLM.from_pretrained(init).state_dict()
    assert trained.keys() == prepared.keys()
    assert any(not (trained[k] == prepared[k]).all() for k in trained)  # it trained
    assert AutoTokenizer.from_pretrained(run / "final").get_vocab() == AutoTokenizer.from_pretrained(init).get_vocab()
    print("sft on verl:", line)


# every other registry method, once each (minutes apiece on CPU): CBPO_SLOW=1
OTHER_METHODS = ["opd", "dapo", "oc_grpo", "arpo", "aepo", "tree_grpo", "gigpo", "branpo", "gspo", "reinforce_pp", "eapo"]


@pytest.mark.slow
@SLOW
@pytest.mark.parametrize("method", OTHER_METHODS)
def test_every_other_method_trains_on_verl(study, method):
    root, _ = study
    # OPD distils from a teacher on GPUs of its own: here the SFT checkpoint, on one more fake GPU
    # (run_name keeps the folder the checks read: method.teacher=PATH would otherwise name it)
    teacher = [f"method.teacher={root / 'runs' / 'smoke' / 'tiny' / 'mix' / 'seed0' / 'sft' / 'final'}",
               "verl.teacher_gpus=1", "verl.teacher_tensor_parallel=1", "run_name=opd"] if method == "opd" else []
    start = time.monotonic()
    train(study, method, *teacher)
    lines = check_finished(run_dir(study, method), 2, rollouts=None)
    if method == "reinforce_pp":  # its k1 KL in the reward: verl computed the reference log-probs
        assert all(m["reward_kl_penalty_coeff"] == 0.001 for m in lines)
    print(f"{method} on verl: {time.monotonic() - start:.0f} s,", [(m["step"], m["rollouts"]) for m in lines])


@pytest.mark.slow
@SLOW
def test_table1_trains_on_verl_through_the_dag_on_a_machine_without_gpus(tmp_path, dag):
    # Issue 39.4: the study as a user types it; each training job one process on verl's CPU
    # platform, one at a time (each starts its own Ray cluster)
    work = tmp_path / "study"
    dag(work, "table1", config=("preset=smoke", "backend=verl"), python=sys.executable, timeout=3 * RUN_LIMIT_S)
    runs = work / "runs" / "smoke" / "tiny" / "mix" / "seed0"
    trained = sorted(p.parent.parent.name for p in runs.glob("*/final/DONE.json"))
    assert "sft" in trained and len(trained) > 2, trained
    for name in trained:
        config = json.loads((runs / name / "provenance.json").read_text())["config"]
        assert config["backend"] == "verl" and config["verl"]["gpus_per_node"] == 1, (name, config["verl"])
        assert (runs / name / "verl").is_dir(), name  # verl's own checkpoints, not the local trainer's
    assert (work / "results" / "tables" / "smoke" / "tiny" / "mix" / "table1.md").is_file()
