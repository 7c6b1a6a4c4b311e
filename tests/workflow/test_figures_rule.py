"""The `figures` target planned (`snakemake -n`): the runs it trains, Fig. 4's extra Pass@k
evaluations and the eval.figures commands, locally and through the SLURM profile."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
MATH = ["aime24", "aime25", "math500", "math", "gsm8k"]
FIGURES = ("fig2", "fig4", "fig5", "curves")


def plan(tmp_path, *args, profile=False, env=ENV):
    """`snakemake -n -p figures` from the repository root, outputs in tmp: the shell commands
    (as words) and the job counts."""
    cmd = [str(SNAKEMAKE), "figures", "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"),
           *(["--profile", "slurm"] if profile else ["-c1"]), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    text = out.stdout + out.stderr
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in text.splitlines() if "Shell command: " in line]
    stats = text.split("Job stats:", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    return shells, {name: int(count) for name, count in (line.split() for line in stats)}


def module_calls(shells, module):
    return [words for words in shells if module in words]


def setting(words, key):
    """The value of a Hydra override ``key=value`` in a command."""
    return next(w.split("=", 1)[1] for w in words if w.startswith(f"{key}="))


def option(words, name):
    """The values after ``name`` up to the next option."""
    start = words.index(name) + 1
    end = next((i for i in range(start, len(words)) if words[i].startswith("-")), len(words))
    return words[start:end]


@pytest.mark.parametrize("profile", [False, True], ids=["local", "slurm"])
def test_figures_train_gigpo_arpo_cbpo_and_sample_pass5_on_math(tmp_path, profile):
    shells, counts = plan(tmp_path, "--config", "preset=smoke", "seeds=[0,1]", profile=profile)
    trained = {(setting(w, "method"), setting(w, "seed")) for w in module_calls(shells, "cbpo.train") if "stage=rl" in w}
    # Table 1's smoke rows (GRPO, CBPO) and Fig. 5's (GiGPO, ARPO, CBPO), each seed once.
    assert trained == {(m, s) for m in ("grpo", "gigpo", "arpo", "cbpo") for s in ("0", "1")}
    assert counts["rl"] == 8
    # Fig. 4: ARPO and CBPO on the math benchmark (arith; twohop is search), sampled, per seed.
    passk = module_calls(shells, "eval.run")
    assert counts["evaluate_passk"] == len(passk) == 4 and "evaluate" not in counts
    for words in passk:
        assert {"benchmark=arith", "evaluation.n_samples=5", "evaluation.temperature=1.0"} <= set(words)
        run, seed = setting(words, "run_name"), setting(words, "seed")
        assert setting(words, "eval_out") == f"results/raw/smoke/tiny/mix/seed{seed}/{run}/arith/pass5"
    assert {(setting(w, "run_name"), setting(w, "seed")) for w in passk} == {(r, s) for r in ("arpo", "cbpo") for s in ("0", "1")}
    figures = {w[w.index("eval.figures") + 1]: w for w in module_calls(shells, "eval.figures")}
    assert set(figures) == set(FIGURES)
    for name, words in figures.items():
        assert option(words, "--out") == [f"results/figures/smoke/tiny/mix/{name}"]
    assert option(figures["fig2"], "--run") == ["runs/smoke/tiny/mix/seed0/cbpo"]
    assert option(figures["fig5"], "--runs") == ["runs/smoke/tiny/mix/seed0", "runs/smoke/tiny/mix/seed1"]
    assert option(figures["fig5"], "--methods") == ["gigpo", "arpo", "cbpo"]
    assert option(figures["curves"], "--methods") == ["grpo", "gigpo", "arpo", "cbpo"]
    assert option(figures["fig4"], "--summary-file") == ["pass5/summary.json"]
    assert option(figures["fig4"], "--benchmarks") == ["arith"]


def test_pass5_settings_come_from_the_figures_config(tmp_path):
    config = tmp_path / "figures.yaml"
    config.write_text("figures: {passk_samples: 8, passk_temperature: 0.6}\n")
    shells, _ = plan(tmp_path, "--configfile", str(config), "--config", "preset=smoke")
    for words in module_calls(shells, "eval.run"):
        assert {"evaluation.n_samples=8", "evaluation.temperature=0.6"} <= set(words)


def test_a_study_without_math_benchmarks_has_no_fig4(tmp_path):
    shells, counts = plan(tmp_path, "--config", "preset=smoke", "benchmarks=[twohop]")
    assert "fig4" not in counts and "evaluate_passk" not in counts and not module_calls(shells, "eval.run")
    assert {w[w.index("eval.figures") + 1] for w in module_calls(shells, "eval.figures")} == {"fig2", "fig5", "curves"}


def test_paper_preset_uses_its_own_five_sample_evaluations(tmp_path):
    root = tmp_path / "data root"  # empty copies of what the paper study reads: planning checks they exist
    for name in MATH:
        (root / "benchmarks" / name).mkdir(parents=True)
        (root / "benchmarks" / name / "test.jsonl").touch()
    (root / "train").mkdir()
    for name in ("toolstar_grpo_mix_train.parquet", "toolstar_sft.jsonl"):
        (root / "train" / name).touch()
    shells, counts = plan(tmp_path, "--config", "preset=paper", "model=qwen3-1.7b", "data=toolstar-math", profile=True,
                          env={**ENV, "CBPO_SHARED_DATA": str(root)})
    assert "evaluate_passk" not in counts
    evaluations = {(setting(w, "run_name"), setting(w, "benchmark")) for w in module_calls(shells, "eval.run")}
    assert evaluations == {(r, b) for r in ("arpo", "cbpo") for b in MATH}
    assert not any(x.startswith(("evaluation.", "eval_out=")) for w in module_calls(shells, "eval.run") for x in w)
    (fig4,) = [w for w in module_calls(shells, "eval.figures") if "fig4" in w]
    assert option(fig4, "--summary-file") == ["summary.json"] and option(fig4, "--benchmarks") == MATH
    assert option(fig4, "--out") == ["results/figures/paper/qwen3-1.7b/toolstar-math/fig4"]


def test_fork_tasks_add_the_credit_lab_over_every_table1_run_and_seed(tmp_path):
    shells, counts = plan(tmp_path, "--config", "preset=smoke", "data=forks", "seeds=[0,1]")
    (lab,) = module_calls(shells, "eval.credit_lab")
    assert option(lab, "--runs") == [f"runs/smoke/tiny/forks/seed{s}/{m}" for s in (0, 1) for m in ("grpo", "gigpo", "arpo", "cbpo")]
    assert option(lab, "--out") == ["results/figures/smoke/tiny/forks/credit_lab"]
    # The data step writes the fork tasks beside the two the scratch tokenizer learns from.
    (data,) = [w for w in shells if "cbpo.prepare" in w and "target=data" in w and "data=forks" in w]
    # Every run dumps its rollouts (the figures and the credit lab read them).
    assert all("rl.dump_rollouts=true" in w for w in module_calls(shells, "cbpo.train") if "stage=rl" in w)


def test_data_without_decisions_has_no_credit_lab(tmp_path):
    shells, counts = plan(tmp_path, "--config", "preset=smoke")
    assert "credit_lab" not in counts and not module_calls(shells, "eval.credit_lab")


@pytest.mark.parametrize("profile", [False, True], ids=["local", "slurm"])
def test_the_seeds_target_is_table1_and_the_credit_lab_over_the_study_seeds(tmp_path, profile):
    cmd = [str(SNAKEMAKE), "seeds", "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"),
           *(["--profile", "slurm"] if profile else ["-c1"]), "--config", "preset=smoke", "data=forks"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in out.stdout.splitlines() if "Shell command: " in line]
    # study_seeds (0-4), not the configured seeds ([0]): five SFT and ten RL runs.
    trained = {(setting(w, "stage"), setting(w, "method") if "stage=rl" in w else "", setting(w, "seed"))
               for w in module_calls(shells, "cbpo.train")}
    assert trained == {("sft", "", s) for s in "01234"} | {("rl", m, s) for m in ("grpo", "gigpo", "arpo", "cbpo") for s in "01234"}
    (report,) = module_calls(shells, "eval.report")
    assert option(report, "--summaries") == [f"results/raw/smoke/tiny/forks/seed{s}" for s in range(5)]
    assert option(report, "--out") == ["results/tables/smoke/tiny/forks/seeds/table1"]
    (lab,) = module_calls(shells, "eval.credit_lab")
    assert len(option(lab, "--runs")) == 20  # 4 Table 1 methods x 5 seeds
    # The forced-choice table: each seed's SFT policy on both fork tasks with the decision forced.
    forced = [w for w in module_calls(shells, "eval.run") if any(x.startswith("evaluation.forced=") for x in w)]
    assert sorted((setting(w, "benchmark"), setting(w, "seed"), setting(w, "evaluation.forced")) for w in forced) == \
        sorted((b, s, "1") for b in ("arith_fork", "search_fork") for s in "01234")
    assert all(setting(w, "run_name") == "sft" and setting(w, "eval_out").endswith("forced1") for w in forced)
    (table,) = module_calls(shells, "eval.forced")
    assert option(table, "--benchmarks") == ["arith_fork=1", "search_fork=1"]
    assert option(table, "--out")[0] == "results/tables/smoke/tiny/forks/seeds/forced"


def test_the_chains_seed_study_forces_both_decisions_of_each_chain_task(tmp_path):
    cmd = [str(SNAKEMAKE), "seeds", "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"), "-c1",
           "--config", "preset=smoke", "data=chains", "methods=[grpo,cbpo,arpo,gigpo,tree_grpo]"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in out.stdout.splitlines() if "Shell command: " in line]
    trained = {(setting(w, "method"), setting(w, "seed")) for w in module_calls(shells, "cbpo.train") if "stage=rl" in w}
    assert trained == {(m, s) for m in ("grpo", "cbpo", "arpo", "gigpo", "tree_grpo") for s in "01234"}
    forced = [w for w in module_calls(shells, "eval.run") if any(x.startswith("evaluation.forced=") for x in w)]
    assert sorted((setting(w, "benchmark"), setting(w, "evaluation.forced")) for w in forced) == \
        sorted((b, k) for b in ("arith_chain", "search_chain") for k in "12" for _ in range(5))
    (table,) = module_calls(shells, "eval.forced")
    assert option(table, "--benchmarks") == ["arith_chain=2", "search_chain=2"]
    (lab,) = module_calls(shells, "eval.credit_lab")
    assert len(option(lab, "--runs")) == 25
