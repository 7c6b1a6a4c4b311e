"""Tables 1-3 and the boundary ablation from evaluation summaries, beside the paper's numbers.

    python -m eval.report table1 --methods sft grpo cbpo --benchmarks arith twohop \
        --summaries results/raw/tiny/tiny/mix/seed0 results/raw/tiny/tiny/mix/seed1 \
        --runs runs/tiny/tiny/mix/seed0 runs/tiny/tiny/mix/seed1 \
        --out results/tables/tiny/tiny/mix/table1
    python -m eval.report table2 --summaries results/raw/tiny/tiny/mix/seed0 --out results/tables/table2 \
        --rows CBPO=cbpo "w/o CBV=cbpo-wo-cbv" --benchmarks arith twohop --backbone Qwen3-1.7B

``--summaries`` names one folder per seed (``seed<N>``) of ``<run>/<benchmark>/summary.json``.
A cell is the mean Pass@1 (%) over the seeds that produced it, with the half-width of its 95%
Student-t interval over seeds, beside the paper's value for ``--backbone``
(``eval/paper/<table>_*_reported.csv``) and the difference. Domain averages are unweighted
means of a seed's benchmark columns, as in the paper. The best value of each column is bold;
cells not produced yet are marked, not dropped. Budget columns: generated tokens and tool calls
per held-out problem (the summaries), per training problem (``--runs``: metrics.jsonl) and
device-hours of the run's training steps and evaluation samples, from the records they leave
(metrics.jsonl ``wall_seconds``, the summaries' ``generation_seconds``), each times the devices
its job held: a record's own ``devices`` (a verl run's lines: its GPUs, an OPD teacher's
included), else ``--devices-per-job``, so a job Snakemake
reruns to find the work done, or that resumes a killed run, does not change them. Writes ``<out>.csv`` (long form, one line per cell), ``<out>.md`` and ``<out>.tex``
(pandas Styler, booktabs rules).

Like with like: a cell is compared with the paper only where its benchmark is the paper's, and a
domain average only where its benchmarks are all of the paper's for that domain (the CPU tasks
are not: the caption says so). An evaluation of a subset (``evaluation.limit`` in the summary's
``provenance.json``) is marked in every cell it feeds and never compared with the paper.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from cbpo.data import read_jsonl
from eval.benchmarks import benchmark_config, list_benchmarks
from eval.verifiers.metrics import macro_average

PAPER_DIR = Path(__file__).with_name("paper")
AVG = {"math": "Math Avg.", "search": "Search Avg."}
# title, what it shows, the row header, the paper's reported values (None: the paper names the
# boundary-only ablation as missing and reports nothing)
TABLES = {
    "table1": ("Table 1", "main results (Sec. 5.2)", "Method", "table1_reported.csv"),
    "table2": ("Table 2", "ablations of CBPO's components (Sec. 5.4)", "Variant", "table2_ablation_reported.csv"),
    "table3": ("Table 3", "rollout allocations: M slots, N initial chains, B = M - N branches (Sec. 5.5)", "(M, N, B)",
               "table3_rollout_reported.csv"),
    "boundary": ("Boundary ablation", "branch candidates from the full response vs tool boundaries only", "Candidates", None),
}
CSV_COLUMNS = ["table", "row", "run", "column", "reproduced", "ci95", "paper", "difference", "produced", "seeds", "summaries"]
MISSING = "—"  # a cell the run has not produced
PARTIAL = "†"  # a cell some seeds have not produced: the mean of those that have
SUBSET = "‡"  # a cell fed by an evaluation of a subset of its benchmark (evaluation.limit)
OTHER = "other"  # Table 1's group of a row the paper does not report
LATEX = {"±": "$\\pm$", PARTIAL: "$^\\dagger$", SUBSET: "$^\\ddagger$", MISSING: "---"}  # applied after ESCAPES, which would escape their $
ESCAPES = {"\\": "\\textbackslash{}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}",
           **{c: "\\" + c for c in "&%$#_{}"}}


class ReportError(ValueError):
    """Inputs the report refuses: main exits 2 with the message."""


@dataclass(frozen=True)
class Seed:
    number: int
    summaries: Path  # <run>/<benchmark>/summary.json
    runs: Path | None  # <run>/metrics.jsonl


@dataclass(frozen=True)
class Budget:
    """How device-hours are counted: ``devices_per_job`` devices of ``device_kind`` per job."""

    device_kind: str
    devices_per_job: int

    @property
    def hours(self) -> str:
        return f"{self.device_kind}-h"


def method_of(run: str):
    """The method class a run is named after; None for a variant."""
    from cbpo.registry import get_method, method_names  # method modules load on use

    return get_method(run) if run in method_names() else None


def display_name(run: str) -> str:
    """A run's row label: its method's name as Table 1 prints it (a variant keeps its own)."""
    method = method_of(run)
    return method.display_name if method else run


def trains(run: str) -> bool:
    """Whether ``run`` has an RL training run: a variant always does; base, tir and sft do not."""
    method = method_of(run)
    return method is None or method.trains


def seed_number(folder: Path, option: str) -> int:
    match = re.fullmatch(r"seed(\d+)", folder.name)
    if match is None:
        raise ReportError(f"{option} {folder}: expected one folder per seed, named seed<N>")
    return int(match[1])


def seeds_of(summaries: Sequence[Path], runs: Sequence[Path] | None) -> list[Seed]:
    """One Seed per ``--summaries`` folder; ``--runs`` names the same seeds in the same order."""
    numbers = [seed_number(folder, "--summaries") for folder in summaries]
    for folder in summaries:  # a mistyped one would show every cell as not produced
        if not folder.is_dir():
            raise ReportError(f"--summaries {folder}: no such folder")
    repeated = sorted({n for n in numbers if numbers.count(n) > 1})
    if repeated:
        raise ReportError(f"--summaries: more than one folder of seed {', '.join(map(str, repeated))}")
    if runs is not None and [seed_number(folder, "--runs") for folder in runs] != numbers:
        raise ReportError(f"--runs: one folder per --summaries folder, seeds {numbers} in that order")
    return [Seed(*seed) for seed in zip(numbers, summaries, runs or [None] * len(numbers))]


def reported(table: str, backbone: str) -> pd.DataFrame:
    """The paper's values of ``table`` for ``backbone``, indexed by row label as the DAG names
    rows (Table 1: display names, with their ``group``; Table 3: ``(M, N, B)``); empty for a
    table the paper does not report."""
    if TABLES[table][3] is None:
        return pd.DataFrame()
    paper = pd.read_csv(PAPER_DIR / TABLES[table][3])
    if backbone not in set(paper["backbone"]):
        raise KeyError(f"the paper reports {table} for {sorted(set(paper['backbone']))}, not {backbone!r}")
    paper = paper[paper["backbone"] == backbone].drop(columns=["backbone"])
    if table == "table3":
        paper.index = [f"({m}, {n}, {b})" for m, n, b in zip(paper.pop("M"), paper.pop("N"), paper.pop("B"))]
    else:
        paper = paper.set_index("method" if table == "table1" else "variant")
    return paper.rename(columns={"avg": AVG["math"], "math_avg": AVG["math"], "search_avg": AVG["search"]})


def table1_rows(methods: Sequence[str], paper: pd.DataFrame) -> tuple[dict[str, str], list[str]]:
    """Table 1's rows (label -> run) in the paper's group order, ``methods``' order within a
    group, rows the paper does not report last; and each row's group."""
    order = list(dict.fromkeys(paper["group"]))
    group = {display_name(m): paper["group"].get(display_name(m), OTHER) for m in methods}
    labels = sorted(group, key=lambda label: order.index(group[label]) if group[label] in order else len(order))
    runs = {display_name(m): m for m in methods}
    return {label: runs[label] for label in labels}, [group[label] for label in labels]


def step_records(metrics: Path) -> list[dict]:
    """A run's logged steps (SFT: every log_every steps; RL: every step); none without metrics."""
    records = [record for _, record in read_jsonl(metrics)] if metrics.is_file() else []
    return [r for r in records if "sft_loss" in r or "reward" in r]


def training_steps(runs: Path, run: str) -> dict[str, list[dict]]:
    """The logged steps of every training the row pays for, by run folder: the SFT run's for
    ``sft``, none for base and tir, the run's own otherwise (OPD's with the teacher the DAG
    trained for it, where there is one)."""
    folders = ["sft"] if run == "sft" else [run] if trains(run) else []
    if run == "opd" and (runs / "teacher" / "metrics.jsonl").is_file():
        folders.append("teacher")
    return {folder: step_records(runs / folder / "metrics.jsonl") for folder in folders}


def per_training_problem(records: Sequence[dict]) -> dict[str, float]:
    """Tokens and tool calls generated per training problem over a run's RL steps; rollouts
    drawn but not trained on (DAPO's dynamic sampling) are spent budget too."""
    steps = [step for step in records if "generated_tokens" in step]
    problems = sum(step["problems"] for step in steps)
    return {name: sum(step[key] + step.get(f"extra_{key}", 0) for step in steps) / problems if problems else np.nan
            for name, key in (("Train tokens", "generated_tokens"), ("Train tool calls", "tool_calls"))}


def device_seconds(steps: Sequence[Sequence[dict]], summaries: Sequence[dict], devices_per_job: int) -> float:
    """Device-seconds of the row's training steps (``training_steps``) and of its evaluation
    samples: each record's seconds times its ``devices``, else ``devices_per_job``; NaN until
    all of them are recorded."""
    timed = all(records and all("wall_seconds" in r for r in records) for records in steps)
    if not timed or any("generation_seconds" not in s for s in summaries):
        return np.nan
    train = sum(r["wall_seconds"] * r.get("devices", devices_per_job) for records in steps for r in records)
    return float(train + sum(s["generation_seconds"] * s.get("devices", devices_per_job) for s in summaries))


def evaluation_settings(summary: Path) -> dict:
    """The ``evaluation`` settings an evaluation ran with (its provenance); empty where
    unrecorded. ``limit`` None: the whole benchmark."""
    provenance = summary.with_name("provenance.json")
    if not provenance.is_file():
        return {}
    return json.loads(provenance.read_text()).get("config", {}).get("evaluation", {})


def seed_cells(seed: Seed, run: str, configs: Mapping[str, dict], budget: Budget) -> tuple[list[dict], set[str]]:
    """One seed's cells of ``run`` (NaN where not produced): Pass@1 (%) per benchmark, domain
    averages, budget, each with whether a subset evaluation feeds it; and the columns scored
    with a fallback metric (to be marked)."""
    paths = {b: seed.summaries / run / b / "summary.json" for b in configs}
    read = {b: json.loads(path.read_text()) for b, path in paths.items() if path.is_file()}
    settings = {b: evaluation_settings(paths[b]) for b in read}
    for b, evaluation in settings.items():
        if evaluation.get("forced"):
            raise ValueError(f"{paths[b]} is a forced-choice diagnostic (evaluation.forced), not an evaluation of {b}")
    subset = {b: evaluation.get("limit") is not None for b, evaluation in settings.items()}
    column = {b: config["display_name"] for b, config in configs.items()}
    scores = {column[b]: 100.0 * read[b]["pass@1"] if b in read else np.nan for b in configs}
    cells = [{"column": column[b], "value": scores[column[b]], "summary": str(paths[b]) if b in read else "",
              "subset": subset.get(b, False)} for b in configs]
    averages = macro_average(scores, {column[b]: config["domain"] for b, config in configs.items()})
    spent = {name: pd.Series([s.get(key, np.nan) for s in read.values()], dtype=float).mean()
             for name, key in (("Tokens", "mean_tokens"), ("Tool calls", "mean_tool_calls"))}
    if seed.runs is not None:
        steps = training_steps(seed.runs, run)  # each metrics.jsonl read once for both columns
        if trains(run):  # a row without a training run leaves these blank
            spent.update(per_training_problem(steps[run]))
        seconds = (device_seconds(list(steps.values()), list(read.values()), budget.devices_per_job)
                   if len(read) == len(configs) else np.nan)
        spent[budget.hours] = seconds / 3600
    fed = {AVG[d]: any(subset.get(b, False) for b, c in configs.items() if c["domain"] == d) for d in averages}
    fed |= {name: any(subset.values()) for name in ("Tokens", "Tool calls", budget.hours)}  # held-out samples
    derived = {**{AVG[d]: v for d, v in averages.items()}, **spent}
    cells += [{"column": name, "value": value, "summary": "", "subset": fed.get(name, False)}
              for name, value in derived.items()]
    return cells, {column[b] for b, summary in read.items() if summary.get("fallback_used")}


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95% Student-t interval of the mean over seeds (n - 1 degrees of freedom)."""
    return float(stats.t.ppf(0.975, len(values) - 1) * stats.sem(values)) if len(values) > 1 else np.nan


def per_seed(seeds: Sequence[Seed], rows: Mapping[str, str], configs: Mapping[str, dict],
             budget: Budget) -> tuple[pd.DataFrame, set[str]]:
    """One line per seed and cell (NaN where not produced); and the columns scored with a
    fallback metric."""
    records, marked = [], set()
    for seed in seeds:
        for row, run in rows.items():
            cells, fallback = seed_cells(seed, run, configs, budget)
            records += [{"row": row, "run": run, "seed": seed.number, **cell} for cell in cells]
            marked |= fallback
    return pd.DataFrame(records), marked


def paired_differences(measured: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Differences paired by seed, mean ± ci95 over the seeds that produced both cells: every
    trained row minus SFT (its initialisation), and CBPO minus every other trained row. A line
    per pair, a column per scored column."""
    runs = dict(zip(measured.row, measured.run))
    trained = [row for row, run in runs.items() if trains(run)]
    pairs = [(row, "SFT") for row in trained if "SFT" in runs]
    pairs += [("CBPO", row) for row in trained if row != "CBPO" and "CBPO" in runs]
    values = measured.pivot_table(index=["row", "seed"], columns="column", values="value", dropna=False)
    lines = {}
    for a, b in pairs:
        diff = (values.loc[a] - values.loc[b])[list(columns)]
        lines[f"{a} − {b}"] = {c: (diff[c].mean(), ci95(diff[c].dropna()), int(diff[c].notna().sum())) for c in columns}
    return pd.DataFrame.from_dict(lines, orient="index", columns=list(columns))


def over_seeds(seeds: Sequence[Seed], rows: Mapping[str, str], configs: Mapping[str, dict],
               budget: Budget) -> tuple[pd.DataFrame, set[str], pd.DataFrame]:
    """One line per cell: the mean over the seeds that produced it, its ci95, those seeds and
    the summaries averaged; the columns scored with a fallback metric; and the per-seed values."""
    measured, marked = per_seed(seeds, rows, configs, budget)
    produced = measured.dropna(subset=["value"]).groupby(["row", "column"], sort=False).agg(
        reproduced=("value", "mean"), ci95=("value", ci95), n=("seed", "size"),
        seeds=("seed", lambda s: " ".join(map(str, s))), summaries=("summary", lambda p: ";".join(filter(None, p))),
        subset=("subset", "any"))
    cells = measured[["row", "run", "column"]].drop_duplicates().merge(produced.reset_index(), on=["row", "column"], how="left")
    # object: with nothing produced at all, the text columns come back as float NaN
    cells = cells.astype({"seeds": object, "summaries": object, "subset": object})
    return cells.fillna({"n": 0, "seeds": "", "summaries": "", "subset": False}).astype({"subset": bool}), marked, measured


def cell_text(cell, digits: int, seeds: int) -> str:
    """Markdown: ``**ours ± ci**† (paper, +diff)``; ours alone where the paper has no value."""
    ours = MISSING
    if cell.produced:
        ours = f"{cell.reproduced:.{digits}f}" + ("" if pd.isna(cell.ci95) else f" ± {cell.ci95:.{digits}f}")
        ours = (f"**{ours}**" if cell.best else ours) + (PARTIAL if cell.n < seeds else "") + (SUBSET if cell.subset else "")
    if pd.isna(cell.paper):
        return ours
    return f"{ours} ({cell.paper:.1f}, {cell.difference:+.1f})" if cell.produced else f"{ours} ({cell.paper:.1f})"


def latex(text: str) -> str:
    """A Markdown cell or caption in LaTeX (a label may hold any character)."""
    text = re.sub(r"[\\~^&%$#_{}]", lambda m: ESCAPES[m[0]], text)
    text = re.sub(r"\*\*(.+?)\*\*", r"\\textbf{\1}", text)
    for markdown, tex in LATEX.items():
        text = text.replace(markdown, tex)
    return text


def comparable_columns(configs: Mapping[str, dict], paper: pd.DataFrame) -> set[str]:
    """The table's columns that measure what the paper's column of that name does: a benchmark
    the paper reports, and a domain average whose benchmarks are all the paper's of that domain."""
    domain_of = {c["display_name"]: c["domain"] for c in map(benchmark_config, list_benchmarks())}
    ours = {c["display_name"]: c["domain"] for c in configs.values()}
    same = {name for name in ours if name in paper.columns}
    for domain in dict.fromkeys(ours.values()):
        papers = {name for name in paper.columns if domain_of.get(name) == domain}
        if papers and papers == {name for name, d in ours.items() if d == domain}:
            same.add(AVG[domain])
    return same


def write_table(table: str, out: Path, rows: Mapping[str, str], groups: Sequence[str] | None, seeds: Sequence[Seed],
                benchmarks: Sequence[str], paper: pd.DataFrame, budget: Budget, backbone: str, label: str) -> None:
    """Any of the four tables: rows as the paper prints them (Table 1: within the paper's
    groups), each cell beside the paper's value for ``backbone``, the best per column bold."""
    title, what, header, _ = TABLES[table]
    configs = {b: benchmark_config(b) for b in benchmarks}
    spent = {"Tokens": 0, "Tool calls": 2}  # budget columns, with the decimals each is shown with
    spent |= {"Train tokens": 0, "Train tool calls": 2} if seeds[0].runs else {}
    spent |= {budget.hours: 2} if seeds[0].runs else {}
    scored = [c["display_name"] for c in configs.values()]
    scored += [AVG[d] for d in dict.fromkeys(c["domain"] for c in configs.values())]
    columns, digits = scored + list(spent), {**dict.fromkeys(scored, 1), **spent}

    cells, marked, measured = over_seeds(seeds, rows, configs, budget)
    same = comparable_columns(configs, paper)
    cells["paper"] = [paper.at[r, c] if r in paper.index and c in same and not sub else np.nan
                      for r, c, sub in zip(cells.row, cells.column, cells.subset)]
    cells["difference"] = cells.reproduced - cells.paper
    cells["produced"] = cells.reproduced.notna()
    shown = cells.reproduced.round(1)  # a tie is a tie as printed
    cells["best"] = (shown == shown.groupby(cells.column).transform("max")) & cells.column.isin(scored)

    out.parent.mkdir(parents=True, exist_ok=True)
    csv = cells.assign(table=table)
    for name in ("reproduced", "ci95", "paper", "difference"):
        csv[name] = [round(v, digits[c]) for v, c in zip(csv[name], csv.column)]
    csv[CSV_COLUMNS].to_csv(out.with_suffix(".csv"), index=False)

    text = cells.assign(text=[cell_text(c, digits[c.column], len(seeds)) for c in cells.itertuples()])
    grid = text.pivot(index="row", columns="column", values="text").reindex(index=list(rows), columns=columns).fillna("")
    grid.index = (pd.MultiIndex.from_arrays([groups, list(rows)], names=["Group", header]) if groups
                  else pd.Index(list(rows), name=header))
    grid = grid.rename(columns={c: f"{c}*" for c in marked}).rename_axis(columns=None)

    numbers = [str(seed.number) for seed in seeds]
    legend = (f"Pass@1 (%), {label}. Each cell: reproduced (paper, {backbone}; difference); {MISSING}: not produced yet; "
              "best per column in bold.")
    legend += (f" Seed {numbers[0]}." if len(seeds) == 1 else f" Mean ± 95% CI half-width (Student t) over seeds "
               f"{', '.join(numbers)}; {PARTIAL}: mean of the seeds that produced it.")
    if TABLES[table][3] is None:
        legend += " The paper reports no values for this ablation."
    elif not same:
        legend += (" None of these benchmarks is the paper's (the CPU demo's tasks stand in for them): "
                   "no cell is compared with the paper.")
    elif set(scored) - same:
        legend += (f" Not compared with the paper (not its benchmarks, or an average over others than its "
                   f"own): {', '.join(c for c in scored if c not in same)}.")
    if cells.subset.any():
        legend += (f" {SUBSET}: fed by an evaluation of a subset of the benchmark (evaluation.limit), "
                   "not compared with the paper.")
    legend += " Tokens, Tool calls: generated per held-out problem (mean over benchmarks)."
    if "Train tokens" in spent:
        legend += " Train tokens, Train tool calls: generated per training problem (blank: no RL training)."
    if budget.hours in spent:
        legend += (f" {budget.hours}: hours of the run's training steps and evaluation samples times "
                   f"{budget.devices_per_job} {budget.device_kind} per job (a verl run: the GPUs it held).")
    if marked:
        legend += f" Columns marked * were scored with a fallback metric (no LLM judge): {', '.join(sorted(marked))}."
    flat = grid.reset_index()
    if groups:  # a group's name once, on its first row
        flat["Group"] = flat["Group"].mask(flat["Group"].duplicated(), "")
    md = flat.to_markdown(index=False, disable_numparse=True)
    paired = paired_differences(measured, scored) if len(seeds) > 1 else pd.DataFrame()
    if not paired.empty:
        paired_text = paired.map(lambda v: MISSING if not v[2] else f"{v[0]:+.1f}" + ("" if np.isnan(v[1]) else f" ± {v[1]:.1f}")
                           + ("" if v[2] == len(seeds) else PARTIAL))
        md += ("\n## Paired by seed\n\nPass@1 differences (points), seed by seed: mean ± 95% CI half-width "
               "(Student t) of the per-seed differences; an interval that excludes 0 is a difference at these "
               f"seeds.\n\n{paired_text.rename_axis('difference').reset_index().to_markdown(index=False, disable_numparse=True)}")
    out.with_suffix(".md").write_text(f"# {title}: {what}\n\n{legend}\n\n{md}\n")
    tex = flat.map(latex).style.hide(axis="index").format_index(escape="latex", axis=1)  # one header row
    out.with_suffix(".tex").write_text(tex.to_latex(hrules=True, caption=latex(f"{title}: {legend}")))


def row_pair(text: str) -> tuple[str, str]:
    """``LABEL=RUN`` (the label may hold '=', a run name never does)."""
    label, sep, run = text.rpartition("=")
    if not sep or not label or not run:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=RUN")
    return label, run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.report")
    sub = parser.add_subparsers(dest="table", required=True)
    for table in TABLES:
        p = sub.add_parser(table)
        p.add_argument("--summaries", type=Path, nargs="+", required=True,
                       help="results/raw/<key> folders, one per seed (seed<N>)")
        p.add_argument("--out", type=Path, required=True, help="path without suffix")
        if table == "table1":
            p.add_argument("--methods", nargs="+", required=True)
        else:
            p.add_argument("--rows", nargs="+", type=row_pair, required=True, help="LABEL=RUN, in table order")
        p.add_argument("--benchmarks", nargs="+", required=True)
        p.add_argument("--backbone", default="Qwen3-1.7B", help="the paper's backbone to compare with")
        p.add_argument("--label", default="reproduced")
        p.add_argument("--runs", type=Path, nargs="+", help="runs/<key> folders in --summaries' seed order: training budget")
        p.add_argument("--devices-per-job", type=int, default=1)
        p.add_argument("--device-kind", choices=("CPU", "GPU"), default="CPU")
    args = parser.parse_args(argv)
    if args.devices_per_job < 1:
        parser.error(f"--devices-per-job must be at least 1, got {args.devices_per_job}")
    try:
        seeds = seeds_of(args.summaries, args.runs)
        paper = reported(args.table, args.backbone)
        rows, groups = table1_rows(args.methods, paper) if args.table == "table1" else (dict(args.rows), None)
        write_table(args.table, args.out, rows, groups, seeds, args.benchmarks, paper,
                    Budget(args.device_kind, args.devices_per_job), args.backbone, args.label)
    except (ValueError, KeyError) as e:  # ReportError, an unknown backbone or benchmark, an unreadable summary
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}.md, .csv, .tex")
    return 0


if __name__ == "__main__":
    sys.exit(main())
