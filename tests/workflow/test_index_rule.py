"""`snakemake -n index` plans results/index.{md,json} after every table of the study."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def test_index_is_planned_after_every_table(tmp_path):
    done = subprocess.run([str(SNAKEMAKE), "-n", "index", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path),
                           "--config", "preset=smoke"], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    plan = done.stdout + done.stderr
    index = plan[plan.index("rule index:"):]
    inputs = re.search(r"input: (.*)", index).group(1).split(", ")
    tables = {f"results/tables/smoke/tiny/mix/{t}.{ext}" for t in ("table1", "table2", "table3", "boundary")
              for ext in ("md", "csv", "tex")}
    assert tables <= set(inputs)
    assert re.search(r"output: results/index.md, results/index.json", index)
    for rule in ("table1", "table2", "table3", "boundary"):
        assert re.search(rf"^rule {rule}:", plan, re.M)
