"""`snakemake -n` plans the results browser after Table 1 and the figures, over every run they
train, as part of `all` (the browser itself: test_smoke_study.py)."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def plan(tmp_path, target):
    out = subprocess.run([str(SNAKEMAKE), "-n", "-p", target, "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-c1",
                          "--config", "preset=smoke", "data=forks"], capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout + out.stderr


def words_of(text, module):
    (line,) = [line for line in text.splitlines() if line.startswith("Shell command: ") and module in line]
    return shlex.split(line.split("Shell command: ", 1)[1])


def option(words, name):
    start = words.index(name) + 1
    return words[start:next((i for i in range(start, len(words)) if words[i].startswith("-")), len(words))]


def test_the_site_shows_table1_the_figures_and_every_run_they_train(tmp_path):
    text = plan(tmp_path, "site")
    words = words_of(text, "eval.site")
    study = "smoke/tiny/forks"
    assert option(words, "--tables") == [f"results/tables/{study}/table1.csv", f"results/figures/{study}/credit_lab.csv"]
    assert {Path(f).stem for f in option(words, "--figures")} == {"fig2", "fig4", "fig5", "curves", "credit_lab"}
    trained = {w.split("=", 1)[1] for line in text.splitlines() if line.startswith("Shell command: ") and "stage=rl" in line
               for w in shlex.split(line.split("Shell command: ", 1)[1]) if w.startswith("method=")}
    assert {"cbpo", "gigpo", "arpo"} <= trained
    assert sorted(option(words, "--runs")) == sorted(f"runs/{study}/seed0/{m}" for m in trained)
    assert option(words, "--out")[0] == "results/site"
    site = text[text.index("rule site:"):]
    assert f"results/tables/{study}/table1.md" in re.search(r"input: (.*)", site).group(1)


def test_all_builds_the_site(tmp_path):
    assert words_of(plan(tmp_path, "all"), "eval.site")
