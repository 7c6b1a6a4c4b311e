"""Command line of the evaluation package: ``python -m eval SUBCOMMAND``.

``score IN.jsonl`` (public contract): each input line is ``{"metric": "math"|"f1"|"em",
"prediction": str, "gold": str | [str]}``, ``prediction`` being a model's raw final text; the
answer is extracted from it (``eval.verifiers.extract``; no answer scores 0) and one ``{"score": float}``
line is printed per input line, in order. ``-`` reads standard input.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from eval.verifiers.extract import extract_answer
from eval.verifiers.qa_metrics import exact_match, f1_score
from eval.verifiers.verify import score_math

CLI_METRICS = ("math", "f1", "em")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="score predictions against golds, one JSON line each")
    score.add_argument("input", help="JSONL file of {metric, prediction, gold}, or - for stdin")
    score.add_argument("--workers", type=int, default=2, help="math verifier processes (default 2)")
    score.add_argument("--timeout", type=float, default=5.0, help="seconds per math item (default 5)")
    args = parser.parse_args(argv)
    try:
        if args.command == "score":
            return _score(args)
    except (OSError, ValueError) as err:
        print(f"python -m eval {args.command}: {err}", file=sys.stderr)
        return 2
    return 1


def _score(args: argparse.Namespace) -> int:
    items = _read_items(args.input)
    scores = [0.0] * len(items)
    math_items = [(i, pred, gold) for i, (metric, pred, gold) in enumerate(items)
                  if metric == "math" and pred is not None]
    if math_items:
        positions, preds, golds = zip(*math_items)
        for i, s in zip(positions, score_math(preds, golds, workers=args.workers, timeout=args.timeout)):
            scores[i] = s
    for i, (metric, pred, gold) in enumerate(items):
        if metric == "f1":
            scores[i] = f1_score(pred, gold)
        elif metric == "em":
            scores[i] = exact_match(pred, gold)
    sys.stdout.write("".join(json.dumps({"score": s}) + "\n" for s in scores))
    return 0


def _read_items(source: str) -> list[tuple[str, str | None, str | list[str]]]:
    """(metric, extracted answer, gold) per non-blank input line; bad lines name their number."""
    handle = sys.stdin if source == "-" else open(source, encoding="utf-8")
    items = []
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{source}:{lineno}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(item, dict):
                raise ValueError(f"{where}: expected a JSON object")
            metric, pred, gold = item.get("metric"), item.get("prediction"), item.get("gold")
            if metric not in CLI_METRICS:
                raise ValueError(f"{where}: metric {metric!r} not one of {CLI_METRICS}")
            if not isinstance(pred, str):
                raise ValueError(f"{where}: prediction must be a string")
            if isinstance(gold, (int, float)) and not isinstance(gold, bool):
                gold = str(gold)
            aliases = isinstance(gold, list) and gold and all(isinstance(g, str) for g in gold)
            if not (isinstance(gold, str) or aliases):
                raise ValueError(f"{where}: gold must be a string or a non-empty list of strings")
            items.append((metric, extract_answer(pred), gold))
    return items


if __name__ == "__main__":
    sys.exit(main())
