"""The forced-choice table (issue #25): what a policy can finish once the winning choice is
forced at its task's first k decisions (``python -m eval.run ... evaluation.forced=k``), beside
its own choices (k = 0, the ordinary evaluation), per seed and mean ± 95% CI half-width.

    python -m eval.forced --summaries results/raw/S/seed0 results/raw/S/seed1 --run sft \\
        --benchmarks arith_chain=2 search_chain=2 --out results/tables/S/seeds/forced

Reads ``<seed>/<run>/<benchmark>/summary.json`` (k = 0) and ``.../forced<k>/summary.json``;
writes ``<out>.md`` and ``<out>.csv``. RL has a rewarded choice to move to at a decision only
where the forced rows score well above zero.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from eval.benchmarks import benchmark_config
from eval.report import ci95, seed_number


def summary_path(seed: Path, run: str, benchmark: str, forced: int) -> Path:
    return seed / run / benchmark / (f"forced{forced}" if forced else "") / "summary.json"


def forced_table(seeds: Sequence[Path], run: str, decisions: dict[str, int]) -> pd.DataFrame:
    """A row per benchmark and k = 0..decisions, Pass@1 (%) per seed, their mean and ci95."""
    rows = []
    for benchmark, n in decisions.items():
        for forced in range(n + 1):
            scores = {}
            for seed in seeds:
                path = summary_path(seed, run, benchmark, forced)
                if not path.is_file():
                    raise FileNotFoundError(f"no summary at {path}")
                scores[f"seed {seed_number(seed, '--summaries')}"] = 100.0 * json.loads(path.read_text())["pass@1"]
            values = list(scores.values())
            rows.append({"benchmark": benchmark_config(benchmark)["display_name"], "forced": forced, **scores,
                         "mean": sum(values) / len(values), "ci95": ci95(values)})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.forced", description=__doc__.splitlines()[0])
    parser.add_argument("--summaries", type=Path, nargs="+", required=True, help="results/raw/<study>/seed<N> folders")
    parser.add_argument("--run", default="sft", help="the evaluated run (default: sft, the RL initialisation)")
    parser.add_argument("--benchmarks", nargs="+", required=True, help="BENCHMARK=K: K decisions to force, one by one")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix (.md, .csv)")
    args = parser.parse_args(argv)
    try:
        decisions = {b: int(k) for b, k in (item.split("=", 1) for item in args.benchmarks)}
        table = forced_table(args.summaries, args.run, decisions)
    except (ValueError, FileNotFoundError, KeyError) as e:  # ReportError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    text = (f"# Forced choices: {args.run}\n\nHeld-out greedy Pass@1 (%) with the winning choice forced at the first "
            "`forced` decisions of each response (0: the policy's own choices; `evaluation.forced`), per seed, "
            "mean and 95% CI half-width (Student t).\n\n" + table.to_markdown(index=False, floatfmt=".1f") + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(f"wrote {args.out}.md, .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
