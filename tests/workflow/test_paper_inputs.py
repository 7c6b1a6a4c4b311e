"""The README's paper command on a data root holding small files in each upstream format and
nothing the hub must provide: `-n` plans every job, the fetch job first, and ends with the GPU-hours;
run without the hub, the fetch job fails at once with one message naming every missing input."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
STUDY = ["table1", "--config", "model=qwen3-1.7b", "preset=paper", "data=toolstar-math"]
# One row in each shipped benchmark's format (../shared/data/README.md); MATH is fetched.
BENCHMARKS = {
    "aime24": {"id": 60, "problem": "Find x.", "answer": "204"},
    "aime25": {"id": 0, "problem": "Find y.", "answer": 70},
    "math500": {"question": "1+1?", "answer": "2", "subject": "Prealgebra", "level": 1},
    "gsm8k": {"question": "2+2?", "answer": "It is 4.\n#### 4"},
}


def data_root(tmp_path) -> Path:
    import datasets

    root = tmp_path / "data root"
    for name, row in BENCHMARKS.items():
        (root / "benchmarks" / name).mkdir(parents=True)
        (root / "benchmarks" / name / "test.jsonl").write_text(json.dumps(row) + "\n")
    (root / "train").mkdir()
    rl = [{"question": "What is 3 * 4?", "ability": "math", "reward_model": "{'ground_truth': '12', 'style': 'rule'}"},
          {"question": "Who wrote Hamlet?", "ability": "qa", "reward_model": "{'ground_truth': ['Shakespeare'], 'style': 'rule'}"}]
    for split in ("train", "test"):  # Tool-Star's RL mix: reward_model a Python-literal string
        datasets.Dataset.from_list(rl).to_parquet(str(root / "train" / f"toolstar_grpo_mix_{split}.parquet"))
    return root


def snakemake(tmp_path, *args, env=None):
    cmd = [str(SNAKEMAKE), *args, "-d", str(tmp_path / "work")]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env or {**ENV, "CBPO_SHARED_DATA": str(data_root(tmp_path))},
                          timeout=600)


def job_counts(text):
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    return {name: int(count) for name, count in (line.split() for line in table)}


def test_the_paper_command_plans_every_job_with_the_fetch_first(tmp_path):
    out = snakemake(tmp_path, *STUDY, "-n", "-p", "--profile", "slurm")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    text = out.stdout + out.stderr
    assert "MissingInput" not in text
    assert job_counts(text) == {"data": 1, "fetch": 1, "sft": 1, "rl": 11, "evaluate": 70, "table1": 1, "total": 85}
    fetch = text[text.index("rule fetch:"):].split("\n\n", 1)[0]
    root = tmp_path / "data root"
    outputs = re.search(r"output: (.*)", fetch).group(1).split(", ")
    assert outputs == [str(root / "train" / "toolstar_sft.jsonl"), str(root / "benchmarks" / "math" / "test.jsonl"),
                       "models/qwen3-1.7b/cbpo_model.json", "models/qwen3-32b/cbpo_model.json"]
    shells = [line for line in text.splitlines() if "-m cbpo" in line or "-m eval" in line]
    (fetch_shell,) = [s for s in shells if "cbpo.fetch" in s]
    assert "HF_HUB_OFFLINE=0" in fetch_shell  # the one job that may reach the hub
    assert all("HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}" in s for s in shells if "cbpo.train" in s or "eval.run" in s)
    # OPD trains against the fetched teacher folder.
    assert any("method=opd" in s and "method.teacher=models/qwen3-32b" in s for s in shells)
    # The cost, last: each GPU stage's jobs, GPU-hours from the resources and the assumed step costs.
    cost = text[text.index("GPU-hours of this plan (paper/qwen3-1.7b/toolstar-math)"):].splitlines()
    assert "assumed, not measured on a GPU" in cost[0]
    rows = {line.split()[0]: line.split() for line in cost[2:6]}
    assert rows["sft"][1:4] == ["1", "8", "96.0"]  # 8 GPUs x 720 min
    # 8 GPUs x 2880 min each; the paper preset trains on verl, where OPD's teacher holds 8 more
    assert rows["rl"][1:4] == ["11", "8-16", str((10 * 8 + 16) * 48.0)]
    assert rows["evaluate"][1:4] == ["70", "1", "280.0"]
    assert "180 s/step x 200 steps (assumed)" in " ".join(rows["rl"])


def test_nothing_is_fetched_once_everything_is_there(tmp_path):
    root = data_root(tmp_path)
    for path in (root / "train" / "toolstar_sft.jsonl", root / "benchmarks" / "math" / "test.jsonl",
                 tmp_path / "work" / "models" / "qwen3-1.7b" / "cbpo_model.json",
                 tmp_path / "work" / "models" / "qwen3-32b" / "cbpo_model.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    out = snakemake(tmp_path, *STUDY, "-n", "--profile", "slurm", env={**ENV, "CBPO_SHARED_DATA": str(root)})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "fetch" not in job_counts(out.stdout + out.stderr)


def test_without_the_hub_the_fetch_job_fails_at_once_naming_every_input(tmp_path):
    root = data_root(tmp_path)
    env = {**ENV, "CBPO_SHARED_DATA": str(root), "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    out = snakemake(tmp_path, str(root / "train" / "toolstar_sft.jsonl"), *STUDY[1:], "-c1", env=env)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "4 input(s) of the study cannot be fetched" in text and "nothing was downloaded" in text
    for repo in ("dongguanting/Tool-Star-SFT-54K", "DigitalLearningGmbH/MATH-lighteval", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-32B"):
        assert repo in text
    assert "by hand: hf download Qwen/Qwen3-1.7B --local-dir models/qwen3-1.7b" in text
    assert not [p for p in (tmp_path / "work" / "models").rglob("*") if p.is_file()]  # Snakemake made the folders only


def test_on_two_nodes_the_plan_asks_gpus_per_node_and_its_cost_counts_every_node(tmp_path):
    out = snakemake(tmp_path, *STUDY, "verl_nodes=2", "-n", "--profile", "slurm")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    text = out.stdout + out.stderr
    sft = next(line for line in text[text.index("rule sft:"):].splitlines() if "resources:" in line)
    assert {"gres=gpu:8", "nodes=2", "tasks=2", "mpi=srun"} <= set(sft.split(": ", 1)[1].split(", ")), sft
    assert " gpu=" not in sft, sft
    cost = text[text.index("GPU-hours of this plan (paper/qwen3-1.7b/toolstar-math)"):].splitlines()
    rows = {line.split()[0]: line.split() for line in cost[2:6]}
    assert rows["sft"][1:3] == ["1", "16"]
    assert rows["rl"][1:3] == ["11", "16-24"]  # OPD's: 8 per node and its teacher's 8, 12 per node
