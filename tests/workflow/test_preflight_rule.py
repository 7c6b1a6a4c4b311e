"""The preflight in the DAG: planning names every input nobody can make at once, and under
`--profile slurm` the doctor runs before anything is submitted (stub SLURM commands here;
tests/cbpo/test_doctor.py checks the doctor itself)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
STUBS = {
    "sbatch": 'printf "%s\\n" "$*" >> "$SBATCH_LOG"; exit 1',
    "sinfo": 'echo "gpu:8|1024000|128"',  # one node: 8 GPUs, 1 TB, 128 CPUs
    "scontrol": 'echo "PartitionName=gpu MaxTime=UNLIMITED State=UP"',
    "sacctmgr": "echo acct",
    "sacct": "exit 0",
    "squeue": "exit 0",
}


def test_planning_names_every_missing_input_at_once(tmp_path):
    root = tmp_path / "empty data root"
    root.mkdir()
    cmd = [str(SNAKEMAKE), "table1", "-n", "--profile", "slurm", "-d", str(tmp_path / "work"),
           "--config", "model=qwen3-1.7b", "preset=paper", "data=toolstar-math"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**ENV, "CBPO_SHARED_DATA": str(root)}, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "MissingInputException" not in text
    assert "4 input(s) of the study are missing" in text
    for name in ("train/toolstar_grpo_mix_train.parquet",
                 "benchmarks/aime25/test.jsonl", "benchmarks/math500/test.jsonl", "benchmarks/gsm8k/test.jsonl"):
        assert str(root / name) + " is missing" in text
    # What the fetch job downloads is planned, not reported.
    assert "toolstar_sft.jsonl is missing" not in text and "qwen3-1.7b/cbpo_model.json is missing" not in text


def test_under_the_slurm_profile_the_doctor_runs_before_any_job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**ENV, "PATH": f"{bin_dir}:{ENV['PATH']}", "SBATCH_LOG": str(tmp_path / "sbatch.log")}
    work = tmp_path / "work"
    cmd = [str(SNAKEMAKE), "table1", "--profile", "slurm", "-d", str(work), "--config", "preset=smoke",
           "--default-resources", "slurm_account=nope", "slurm_partition=gpu"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "PROBLEM [slurm] account 'nope' is not one of yours in sacctmgr" in text and "the preflight found problems" in text
    assert not (tmp_path / "sbatch.log").exists() and not (work / "data").exists()  # nothing ran, nothing was submitted
