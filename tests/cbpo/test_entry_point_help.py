"""`--help` of the Hydra entry points: their own usage first (what they do, the settings people
change, the options they accept), then Hydra's settings dump without its internal groups."""
import os
import subprocess
import sys

import pytest

from cbpo.registry import get_method, known_methods
from eval.benchmarks import list_benchmarks

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def run(tmp_path, module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                          timeout=300)


@pytest.mark.parametrize("module,accepted", [
    ("cbpo.train", lambda: [m for m in known_methods() if get_method(m).trains]),
    ("eval.run", list_benchmarks),
    ("cbpo.prepare", lambda: ["forks", "mix", "tiny"]),
])
def test_help_starts_with_the_entry_points_usage(tmp_path, module, accepted):
    out = run(tmp_path, module, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith(f"python -m {module}: ")
    usage = text.split("== Every setting", 1)[0]
    assert "Settings people change" in usage and all(name in usage for name in accepted())
    assert "sft:" in text and "schema/method" not in text  # Hydra's dump follows, not its internal group list


def test_an_unknown_benchmark_is_named_with_the_known_ones(tmp_path):
    out = run(tmp_path, "eval.run", "benchmark=nope")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "benchmark=nope" in out.stderr and ", ".join(list_benchmarks()) in out.stderr
