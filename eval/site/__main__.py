"""``python -m eval.site``: write the results browser (see the package docstring)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from eval.site import __doc__ as DOC
from eval.site.build import write_pages
from eval.site.trajectories import write_trajectories


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.site", description=DOC.splitlines()[0])
    parser.add_argument("--tables", type=Path, nargs="*", default=[], help="eval.report or credit-lab CSV files")
    parser.add_argument("--figures", type=Path, nargs="*", default=[], help="PNG files (eval.figures, eval.credit_lab)")
    parser.add_argument("--runs", type=Path, nargs="*", default=[],
                        help="training run folders whose rollouts/step_*.jsonl the viewer shows (named seedN/RUN)")
    parser.add_argument("--max-problems", type=int, default=8, help="problems kept of each dumped step")
    parser.add_argument("--label", default="", help="the study, as the tables' captions name it")
    parser.add_argument("--out", type=Path, required=True, help="the site's folder (index.html, trajectories.html)")
    args = parser.parse_args(argv)
    try:
        write_pages(args.tables, args.figures, args.label, args.out)
        write_trajectories([(f"{r.parent.name}/{r.name}", r) for r in args.runs], args.out, args.max_problems)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/index.html, trajectories.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
