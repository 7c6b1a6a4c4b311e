"""The training rules' SLURM submission on verl (workflow/rules/train.smk): N nodes are one
allocation, one task per node, whose shell starts Ray across it (slurm/ray-on-slurm.sh)
before the trainer for rl, and the SFT launch (its torchrun per node, cbpo/backends/verl/sft.py)
for sft. sbatch is a stub that records its arguments and refuses."""
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
KEY = "runs/smoke/tiny/mix/seed0"
STUBS = {
    "sbatch": 'printf "%s\\n" "$*" >> "$SBATCH_LOG"; echo "stub: not submitting" >&2; exit 1',
    "sacctmgr": "echo acct",
    "sacct": "exit 0",
    "squeue": "exit 0",
    "sinfo": "exit 0",
}


def submit(tmp_path, *config, target=f"{KEY}/cbpo/final/DONE.json") -> tuple[list[str], str]:
    """The sbatch arguments of ``target``'s job (CBPO's rl job), and the shell command it would run."""
    bin_dir = tmp_path / "stub bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_LOG": str(tmp_path / "sbatch.log"),
           "OMP_NUM_THREADS": "1"}
    work = tmp_path / "work"
    made = [*(f"data/tasks/{t}/{s}.jsonl" for t in ("arith", "twohop") for s in ("train", "test")),
            "models/tiny/cbpo_model.json", f"{KEY}/sft/final/DONE.json"]
    made = [path for path in made if path != target]
    for i, path in enumerate(made):  # each newer than what it was made from
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).touch()
        os.utime(work / path, (time.time() + i, time.time() + i))
    cmd = [str(SNAKEMAKE), target, "--profile", "slurm", "-d", str(work), "--retries", "0",
           "-p", "--slurm-init-seconds-before-status-checks", "1", "--config", "preset=smoke", "preflight=false", *config,
           "--default-resources", "slurm_account=acct"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    (line,) = (tmp_path / "sbatch.log").read_text().splitlines() or [out.stderr[-4000:]]
    shell = next((line for line in (out.stdout + out.stderr).splitlines() if "-m cbpo.train" in line), out.stderr[-4000:])
    return shlex.split(line.split(" --wrap=", 1)[0]), shell


def test_verl_on_two_nodes_is_one_allocation_starting_ray_then_the_trainer(tmp_path):
    args, shell = submit(tmp_path, "backend=verl", "verl_nodes=2")
    # verl's recipe: N nodes, one task each; resources.rl's 8 GPUs on every node.
    assert {"--nodes=2", "--ntasks=2", "--gres=gpu:8", "--cpus-per-gpu=8"} <= set(args), args
    assert not any(a.startswith("--gpus") for a in args), args
    assert "--ntasks-per-gpu" not in " ".join(args)
    words = shlex.split(shell)
    launcher = words.index(str(ROOT / "slurm" / "ray-on-slurm.sh"))
    assert Path(words[launcher + 1]).resolve() == Path(sys.executable).resolve() and words[launcher + 2:launcher + 4] == ["-m", "cbpo.train"], words
    assert {"backend=verl", "verl.nodes=2"} <= set(words[launcher:]), words


def test_verl_on_one_node_starts_ray_in_its_one_node_job(tmp_path):
    args, shell = submit(tmp_path, "backend=verl")
    assert "--gpus=8" in args and not any(a.startswith(("--nodes", "--ntasks=")) for a in args), args
    words = shlex.split(shell)
    assert str(ROOT / "slurm" / "ray-on-slurm.sh") in words and "verl.nodes=1" in words, words


def test_sft_on_two_nodes_is_one_allocation_whose_shell_runs_on_the_first(tmp_path):
    args, shell = submit(tmp_path, "backend=verl", "verl_nodes=2", target=f"{KEY}/sft/final/DONE.json")
    # the shell runs in the batch script (mpi: srun), where the launch sruns a torchrun per node
    assert {"--nodes=2", "--ntasks=2", "--gres=gpu:8", "--cpus-per-gpu=8"} <= set(args), args
    words = shlex.split(shell)
    assert {"stage=sft", "backend=verl", "verl.nodes=2", "verl.gpus_per_node=8"} <= set(words), words
    assert str(ROOT / "slurm" / "ray-on-slurm.sh") not in words and words[0] != "srun", words


def plan(tmp_path, *config, profile=False, env=None) -> str:
    """``snakemake -n -p table1`` on the smoke preset and the verl backend (here, or under the SLURM
    profile): the plan's text."""
    where = ["--profile", "slurm"] if profile else ["-c2"]
    cmd = [str(SNAKEMAKE), "table1", "-n", "-p", *where, "-d", str(tmp_path / "work"),
           "--config", "preset=smoke", "backend=verl", "preflight=false", *config]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out.stdout + out.stderr


def training_jobs(text: str) -> dict[str, tuple[set[str], int]]:
    """Each training job's trainer arguments and threads (Snakemake prints them above 1), by
    "sft" or its method= argument."""
    jobs = {}
    for block in text.split("\nrule ")[1:]:
        if not block.startswith(("sft:", "rl:")):
            continue
        lines = block.splitlines()
        words = shlex.split(next(line for line in lines if "-m cbpo.train" in line).split(" > ", 1)[0])
        threads = [int(line.split(":")[1]) for line in lines if line.strip().startswith("threads:")]
        jobs["sft" if "stage=sft" in words else next(w for w in words if w.startswith("method="))] = (set(words), (threads or [1])[0])
    return jobs


def test_a_local_verl_study_trains_on_this_machines_shape_and_one_job_at_a_time(tmp_path):
    # Issue 39.4: a machine without GPUs trains each job as one process (verl's CPU platform), not
    # the SLURM profile's 8 GPUs, and each job holds every core Snakemake has (its own Ray cluster)
    jobs = training_jobs(plan(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}))
    assert {"sft", "method=cbpo", "method=grpo"} <= set(jobs), jobs
    for words, threads in jobs.values():
        assert {"backend=verl", "verl.nodes=1", "verl.gpus_per_node=1"} <= words and threads == 2, (words, threads)
    # a machine with GPUs: its own; the user's setting wins over both
    jobs = training_jobs(plan(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    assert all("verl.gpus_per_node=4" in words for words, _ in jobs.values()), jobs
    jobs = training_jobs(plan(tmp_path, "verl_gpus_per_node=2", env={"CUDA_VISIBLE_DEVICES": ""}))
    assert all("verl.gpus_per_node=2" in words for words, _ in jobs.values()), jobs


def test_under_the_slurm_profile_the_plan_keeps_the_profiles_gpus(tmp_path):
    jobs = training_jobs(plan(tmp_path, profile=True, env={"CUDA_VISIBLE_DEVICES": ""}))
    assert jobs and all("verl.gpus_per_node=8" in words for words, _ in jobs.values()), jobs


def test_async_training_reaches_the_rl_jobs_on_verl_and_is_refused_elsewhere(tmp_path):
    # #37 item 4: --config async_training=one_step_off: verl's one-step-off-policy trainer for rl
    jobs = training_jobs(plan(tmp_path, "async_training=one_step_off", env={"CUDA_VISIBLE_DEVICES": ""}))
    for name, (words, _) in jobs.items():
        assert ("rl.async_training=one_step_off" in words) == (name != "sft"), (name, words)
    assert all(not any(w.startswith("rl.async_training") for w in words) for words, _ in training_jobs(plan(tmp_path)).values())
    out = subprocess.run([str(SNAKEMAKE), "table1", "-n", "-d", str(tmp_path / "local"), "--config", "preset=smoke",
                          "async_training=one_step_off"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0 and "it needs backend=verl" in out.stdout + out.stderr
