"""`make credit` (issue #36): the relay study as the Makefile runs it, planned at the tiny
preset over five seeds, and run end to end at the smoke preset on one seed."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
METHODS = ("grpo", "cbpo", "cbpo-decisions", "cbpo-alive", "arpo", "gigpo", "tree_grpo")


def make_credit(args: str, timeout: float) -> str:
    """``make credit CREDIT_ARGS=args`` from the repository, the venv taken as built (-o)."""
    out = subprocess.run(["make", "-s", "-o", ".venv/.installed", "credit", f"CREDIT_ARGS={args}"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out.stdout + out.stderr


def setting(words, key):
    return next(w.split("=", 1)[1] for w in words if w.startswith(f"{key}="))


def test_make_credit_plans_every_method_and_variant_over_five_seeds_dumping_every_step(tmp_path):
    text = make_credit(f"-n -p -d {tmp_path / 'work'}", timeout=300)
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in text.splitlines() if "Shell command: " in line]
    rl = [w for w in shells if "cbpo.train" in w and "stage=rl" in w]
    run = [setting(w, "variant") if any(x.startswith("variant=") for x in w) else setting(w, "method") for w in rl]
    assert sorted(zip(run, (setting(w, "seed") for w in rl))) == sorted((m, str(s)) for m in METHODS for s in range(5))
    assert all("rl.dump_every=1" in w and "data=relay" in w and "preset=tiny" in w for w in rl)
    (variant,) = {tuple(w[w.index("variant=cbpo-decisions"):]) for w in rl if "variant=cbpo-decisions" in w and setting(w, "seed") == "0"}
    assert {"method.candidates=tool_boundary", "method.alpha=0.3"} <= set(variant)
    # The SFT policy with the winning choice forced at its first k of the relay's four decisions.
    forced = [setting(w, "evaluation.forced") for w in shells if "eval.run" in w and any(x.startswith("evaluation.forced=") for x in w)]
    assert sorted(forced) == sorted(str(k) for k in range(1, 5) for _ in range(5))
    (lab,) = [w for w in shells if "eval.credit_lab" in w]
    runs = lab[lab.index("--runs") + 1: lab.index("--out")]
    assert sorted(runs) == sorted(f"runs/tiny/tiny/relay/seed{s}/{m}" for m in METHODS for s in range(5))


def test_make_credit_runs_end_to_end_at_the_smoke_preset(tmp_path):
    work = tmp_path / "work"
    make_credit(f"preset=smoke study_seeds=[0] -d {work}", timeout=1500)
    tables, figures = work / "results/tables/smoke/tiny/relay/seeds", work / "results/figures/smoke/tiny/relay/seeds"
    cells = pd.read_csv(tables / "table1.csv")
    assert {"GRPO", "CBPO", "cbpo-decisions", "cbpo-alive", "ARPO", "GIGPO", "Tree-GRPO", "SFT"} <= set(cells["row"])
    assert (tables / "forced.md").stat().st_size > 0
    lab = pd.read_csv(figures / "credit_lab.csv")
    assert set(lab["method"]) == set(METHODS)
    # Every step dumped: the smoke preset's two.
    assert set(lab.loc[lab["step"] != "all", "step"].astype(int)) == {1, 2}
    assert "## Steps to 0.8 on every decision" in (figures / "credit_lab.md").read_text()
    for suffix in (".png", ".pdf"):
        assert (figures / f"credit_lab{suffix}").stat().st_size > 0
