"""Which runs produced each table cell: ``results/index.{md,json}``.

    python -m eval.index --tables results/tables --out results/index

Reads every long-form table CSV under ``--tables`` (one line per cell, with the seeds and the
``summary.json`` paths it averages; other CSVs are skipped) and follows each summary to what made
it: the checkpoint and fingerprint its ``identity.json`` names, the git commit of the evaluation
(its ``provenance.json``) and of the training run (the checkpoint's run folder's). A summary
that is gone is listed as missing. Paths are read relative to the working directory, as the
tables write them.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path
from typing import Any

from cbpo.data import write_atomically
from cbpo.provenance import read_git
from eval.report import CSV_COLUMNS
from eval.runner import IDENTITY

_NUMBERS = ("reproduced", "ci95", "paper", "difference")


def trace_summary(path: str) -> dict[str, Any]:
    """One summary's evaluation: checkpoint, fingerprint, seed and the git state of the
    evaluation and of the training run, each None where its file is missing; ``present`` is
    False once the summary itself is gone."""
    folder = Path(path).parent
    identity_file = folder / IDENTITY
    identity = json.loads(identity_file.read_text()) if identity_file.is_file() else {}
    checkpoint = identity.get("checkpoint")
    return {
        "path": path,
        "present": Path(path).is_file(),
        "seed": identity.get("seed"),
        "checkpoint": checkpoint,
        "fingerprint": identity.get("fingerprint"),
        "evaluation": read_git(folder),
        # A trained checkpoint is <run>/final; a prepared model folder or hub id has no run.
        "training": None if checkpoint is None else read_git(Path(checkpoint).parent),
    }


def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


def read_cells(table: Path) -> list[dict[str, Any]] | None:
    """The cells of one table CSV with their summaries traced; None for a CSV of another kind."""
    with table.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if not set(CSV_COLUMNS) <= set(reader.fieldnames or ()):  # not a table of cells
            return None
        lines = list(reader)
    cells = []
    for line in lines:
        cell = {k: line[k] for k in CSV_COLUMNS}
        cell.update({k: _number(line[k]) for k in _NUMBERS})
        cell["produced"] = line["produced"].strip().lower() == "true"
        cell["seeds"] = [int(s) for s in line["seeds"].split()]
        cell["summaries"] = [trace_summary(p) for p in line["summaries"].split(";") if p.strip()]
        cells.append(cell)
    return cells


def build_index(tables: Path) -> list[dict[str, Any]]:
    """One record per table CSV under ``tables``, in path order."""
    index = []
    for path in sorted(tables.rglob("*.csv")):
        cells = read_cells(path)
        if cells is not None:
            index.append({"file": str(path), "cells": cells})
    return index


def _commit(git: dict[str, Any] | None) -> str | None:
    if not git or not git.get("commit"):
        return None
    return git["commit"][:10] + ("+dirty" if git.get("dirty") else "")


def _commits(summaries: list[dict[str, Any]], stage: str) -> str:
    found = sorted({c for s in summaries if (c := _commit(s[stage]))})
    return " ".join(f"`{c}`" for c in found) or "—"


def render(index: list[dict[str, Any]], tables: Path, here: Path) -> str:
    """Markdown: a section per table file, a line per (row, run) with its seeds, commits and
    links (relative to ``here``, the index's folder) to the summaries it averages."""
    lines = ["# Results index", "", f"Which runs produced each cell of the tables under `{tables}`.", ""]
    if not index:
        lines.append("No tables yet.")
    for table in index:
        lines += [f"## `{table['file']}`", "",
                  "| row | run | seeds | evaluation commit | training commit | summaries |",
                  "| --- | --- | --- | --- | --- | --- |"]
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for cell in table["cells"]:
            rows.setdefault((cell["row"], cell["run"]), []).append(cell)
        for (row, run), cells in rows.items():
            summaries = [s for c in cells for s in c["summaries"]]
            seeds = sorted({s for c in cells for s in c["seeds"]})
            links = []
            for cell in cells:
                for s in cell["summaries"]:
                    label = cell["column"] if s["seed"] is None else f"{cell['column']} seed {s['seed']}"
                    links.append(f"[{label}]({os.path.relpath(s['path'], here)})" if s["present"]
                                 else f"{label}: missing `{s['path']}`")
            lines.append(f"| {row} | {run} | {' '.join(map(str, seeds)) or '—'} | {_commits(summaries, 'evaluation')} "
                         f"| {_commits(summaries, 'training')} | {', '.join(links) or 'not produced'} |")
        lines.append("")
    return "\n".join(lines)


def write_index(tables: Path, out: Path) -> None:
    """``<out>.json`` (every cell's record) and ``<out>.md``."""
    index = build_index(tables)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(Path(f"{out}.json"), json.dumps({"tables": index}, indent=1) + "\n")
    write_atomically(Path(f"{out}.md"), render(index, tables, out.parent) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eval.index", description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=Path, required=True, help="folder searched for table CSVs")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = p.parse_args(argv)
    write_index(args.tables, args.out)
    print(f"wrote {args.out}.md and {args.out}.json")


if __name__ == "__main__":
    main()
