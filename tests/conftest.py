"""Fixtures shared across the test packages: the tiny model, the studies (the DAG run once per
configuration, shared by every test that only reads its outputs), the preparation of a run
folder as the DAG's first rules make it; the engine tier's skip; and the order in which
pytest-xdist workers take the modules (`make test` runs the main tier with `-n 2`,
docs/test-suite.md)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
# What every entry point a test starts runs under: one thread (two processes share two cores),
# no W&B, no hub.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="session")
def tiny_causal_lm():
    """``tiny_causal_lm(tokenizer)``: a seeded one-layer Qwen3 over the tokenizer's vocabulary,
    small enough for trainer and method tests to run RL steps in well under a second."""

    def make(tokenizer):
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                          pad_token_id=tokenizer.pad_token_id)
        return Qwen3ForCausalLM(cfg)

    return make


# --------------------------------------------------------------------------------------------
# Studies

def run_dag(workdir: Path, *args, config=("preset=smoke",), python: str = sys.executable, cores: int = 2,
            check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` on the repository's Snakefile with outputs in ``workdir``, as a user
    types it (``-c2``; ``--config`` last)."""
    snakemake = Path(python).with_name("snakemake")
    cmd = [str(snakemake), *args, "-s", str(ROOT / "Snakefile"), "-d", str(workdir), f"-c{cores}", "--config", *config]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    if check:
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out


@pytest.fixture(scope="session")
def dag():
    """:func:`run_dag`, for test modules (which cannot import this file)."""
    return run_dag


# The smoke study's configuration: the fork tasks, as `make demo` runs them (both domains and
# tools; decisions, so the credit lab is drawn too).
SMOKE_STUDY = ("preset=smoke", "data=forks")
SMOKE_KEY = "smoke/tiny/forks"


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory) -> Path:
    """`snakemake all` on the smoke preset and the fork tasks (Table 1 with its four RL rows,
    Tables 2 and 3, the boundary table, every figure and the credit lab, the index, the results
    browser) and Snakemake's report of it (report.html), computed once for every test that only
    reads a study's outputs: they live in tests/workflow/test_smoke_study.py, so that under
    xdist (one module, one worker) it is computed once too. Tests that must run a study
    differently (faults, a killed run, a bad setting) keep their own smallest run."""
    work = tmp_path_factory.mktemp("smoke_study")
    run_dag(work, "all", config=SMOKE_STUDY)
    run_dag(work, "all", "--report", str(work / "report.html"), config=SMOKE_STUDY)
    return work


def prepare_runs(root: Path, python: str = sys.executable, sft: bool = True, env: dict | None = None) -> list[str]:
    """What the DAG's first rules make, under ``root``: the smoke preset's task files and tiny
    model (``cbpo.prepare``), and with ``sft`` its SFT run (``cbpo.train stage=sft``), each by
    its entry point in ``python``'s environment. Returns the overrides that point a later
    command at them (``runs/smoke/tiny/mix/seed0/<run>`` under ``root``)."""
    paths = ["preset=smoke", f"paths.data_dir={root / 'data'}", f"paths.models_dir={root / 'models'}",
             f"paths.runs_dir={root / 'runs'}"]
    steps = [["cbpo.prepare", "target=data"], ["cbpo.prepare", "target=model"]] + [["cbpo.train", "stage=sft"]] * sft
    for step in steps:
        done = subprocess.run([python, "-m", *step, *paths], cwd=root, env=env or ENV, capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
    return paths


@pytest.fixture(scope="session")
def prepare():
    """:func:`prepare_runs`, for test modules."""
    return prepare_runs


# --------------------------------------------------------------------------------------------
# Collection: the engine tier's skip; the order under xdist

ENGINES = ("vllm", "verl", "ray")
# `make test` runs the main tier with `-n 2 --dist loadfile --no-loadscope-reorder`: each module on
# one worker (a module-scoped fixture is computed once), handed out in collection order. These
# modules, the longest (docs/test-suite.md), go first so the other worker fills in around them;
# test_workflow.py (its planned DAGs, about 10 min) taken last once left the other worker idle for
# its last minutes (docs/test-suite.md).
# (Not xdist_group marks: pytest-xdist 3.8 cannot rename a pytest 9.2 test, and ignores them.)
FIRST = ("tests/workflow/test_slurm_cluster.py", "tests/workflow/test_smoke_study.py", "tests/test_workflow.py")


def pytest_collection_modifyitems(config, items):
    """``engines`` tests run the real vLLM, verl and Ray: in .venv-engines (``make test`` runs
    them there), skipped with one line elsewhere. On an xdist worker, FIRST's modules first."""
    lacking = [m for m in ENGINES if importlib.util.find_spec(m) is None]
    if lacking:
        skip = pytest.mark.skip(reason=f"engine tier: {', '.join(lacking)} not importable here (make engines builds .venv-engines)")
        for item in items:
            if "engines" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.path.relative_to(ROOT).as_posix(), len(FIRST)))  # stable
