"""Figures 2, 4 and 5 of the paper and every trained method's reward curve, from result files only.

    python -m eval.figures fig2 --run runs/S/seed0/cbpo --out results/figures/S/fig2
    python -m eval.figures fig4 --summaries results/raw/S/seed0 results/raw/S/seed1 --methods arpo cbpo \
        --summary-file pass5/summary.json --benchmarks aime24 math500 --out results/figures/S/fig4
    python -m eval.figures fig5 --runs runs/S/seed0 runs/S/seed1 --methods gigpo arpo cbpo --out results/figures/S/fig5
    python -m eval.figures curves --runs runs/S/seed0 runs/S/seed1 --methods grpo cbpo --out results/figures/S/curves

``S`` is a study (``<preset>/<model>/<data>``); ``--runs`` and ``--summaries`` give one folder
per seed. Each command writes ``<out>.png`` and ``<out>.pdf``. Training curves read each run's
``metrics.jsonl``; Fig. 2 and Fig. 5 (c, d) read the newest rollout dump of a CBPO run
that has a chosen branch point (``rollouts/step_*.jsonl``, ``rl.dump_rollouts=true``; the newest
dump where none has) and its ``run_key.json`` (the method's
w, rho_path and rho_node). Across seeds a curve or bar is the mean with a 95% Student-t interval.
A missing input file is an error naming it (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cbpo.branching import balanced_priority
from cbpo.data import read_jsonl
from cbpo.registry import known_methods
from eval.benchmarks import benchmark_config
from eval.report import ci95, display_name

PASS_K = ("1", "3", "5")
CBPO_RUN = "cbpo"  # the run whose rollout dump Figs. 2 and 5 (c, d) show


def existing(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"missing input file {path}")
    return path


def figure(**kwargs) -> Figure:
    """A figure outside pyplot: nothing global, no display; savefig renders PNG with Agg."""
    return Figure(layout="constrained", **kwargs)


def color(method: str):
    """One colour per method in every figure: tab20's ten dark shades first, then its light ones.
    Any other run (a variant, ``cbpo-alive``) takes one of tab20b's by a hash of its name: the
    same in every figure and every process."""
    if method not in known_methods():
        return colormaps["tab20b"](zlib.crc32(method.encode()) % 20)
    i = known_methods().index(method) % 20
    return colormaps["tab20"](2 * i % 20 + i // 10)


def save(fig: Figure, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".png", ".pdf"):
        fig.savefig(f"{out}{suffix}", dpi=150)


# ----------------------------------------------------------------------------- training curves

def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean over seeds and its 95% interval ``(mean, lower, upper)``; one seed has none."""
    mean, half = float(np.mean(values)), ci95(values)
    return (mean, mean, mean) if np.isnan(half) else (mean, mean - half, mean + half)


def step_series(metrics: Path, value: Callable[[dict], float]) -> dict[int, float]:
    """``value(record)`` of every training step in a run's ``metrics.jsonl`` (step -> value)."""
    series = {}
    for _, record in read_jsonl(existing(metrics)):
        if "reward" in record and record.get("rollouts"):  # a training step that sampled rollouts
            series[int(record["step"])] = float(value(record))
    return series


def seed_band(series: Sequence[Mapping[int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps and the mean, lower and upper 95% bound across seeds at each step (the seeds
    that logged it)."""
    steps = sorted(set().union(*series))
    rows = [mean_ci([s[step] for s in series if step in s]) for step in steps]
    mean, low, high = (np.array(col) for col in zip(*rows)) if rows else (np.zeros(0),) * 3
    return np.array(steps), mean, low, high


def plot_band(ax, runs: Sequence[Path], method: str, value: Callable[[dict], float]) -> None:
    steps, mean, low, high = seed_band([step_series(r / method / "metrics.jsonl", value) for r in runs])
    ax.plot(steps, mean, color=color(method), lw=2, label=display_name(method))
    ax.fill_between(steps, low, high, color=color(method), alpha=0.2, lw=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def reward(record: dict) -> float:
    return record["reward"]


def tool_calls_per_rollout(record: dict) -> float:
    return record["tool_calls"] / record["rollouts"]


def seeds_note(runs: Sequence[Path]) -> str:
    return f"mean ± 95% CI over {len(runs)} seeds" if len(runs) > 1 else "one seed"


def curves(runs: Sequence[Path], methods: Sequence[str], out: Path, label: str) -> None:
    """Training reward over steps of every trained run of Table 1."""
    fig = figure(figsize=(6.4, 4))
    ax = fig.subplots()
    for method in methods:
        plot_band(ax, runs, method, reward)
    ax.set(xlabel="training step", ylabel="mean reward", title=f"Training reward ({seeds_note(runs)})")
    ax.legend(fontsize="small")
    fig.suptitle(label, fontsize="small")
    save(fig, out)


# ----------------------------------------------------------------------------- rollout dumps

def run_dumps(run: Path) -> list[Path]:
    """A run's rollout dumps, oldest step first."""
    dumps = sorted((run / "rollouts").glob("step_*.jsonl"))
    if not dumps:
        raise FileNotFoundError(f"missing input file {run / 'rollouts'}/step_*.jsonl (train with rl.dump_rollouts=true)")
    return dumps


# What the figures read of a dumped rollout (a paper-scale dump holds thousands of long ones):
# a parent's tokens and annotations, a branch's origin.
PARENT_FIELDS = ("problem", "kind", "model_mask", "entropy", "candidates", "priorities", "chosen")
OTHER_FIELDS = ("problem", "kind", "parent", "at")


def problem_groups(path: Path) -> list[list[dict]]:
    """A dump's rollouts per problem, in order: each problem's set R_x starts with its parents
    (Algorithm 1), so a parent after a non-parent, or another problem id, starts a new set."""
    groups: list[list[dict]] = []
    for _, row in read_jsonl(path):
        row = {k: row[k] for k in (PARENT_FIELDS if row["kind"] == "parent" else OTHER_FIELDS) if k in row}
        last = groups[-1][-1] if groups else None
        if last is None or row["problem"] != last["problem"] or (row["kind"] == "parent" and last["kind"] != "parent"):
            groups.append([])
        groups[-1].append(row)
    return groups


def dump_response(run: Path) -> tuple[Path, list[list[dict]], tuple[int, int]]:
    """The newest dump of a CBPO run where a branch point was chosen (else its newest dump),
    its problem sets and the (set, parent) of the response shown."""
    dumps = run_dumps(run)
    for path in reversed(dumps):
        groups = problem_groups(path)
        if any(r.get("chosen") for g in groups for r in g):
            break
    else:
        path, groups = dumps[-1], problem_groups(dumps[-1])
    try:
        return path, groups, choose_response(groups)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def choose_response(groups: Sequence[Sequence[dict]]) -> tuple[int, int]:
    """(problem set, parent) of the parent with the most chosen branch points, then the most
    candidates; the earliest in the dump on a tie."""
    parents = [(x, k) for x, g in enumerate(groups) for k, r in enumerate(g) if r["kind"] == "parent" and "chosen" in r]
    if not parents:
        raise ValueError("the rollout dump has no CBPO annotations (candidates, chosen)")
    return max(parents, key=lambda xk: (len(groups[xk[0]][xk[1]]["chosen"]), len(groups[xk[0]][xk[1]]["candidates"]),
                                        -xk[0], -xk[1]))


def method_config(run: Path) -> dict:
    """The method settings the run was trained with (its run_key.json)."""
    return json.loads(existing(run / "run_key.json").read_text())["method"]


def model_entropy(row: dict) -> np.ndarray:
    return np.asarray(row["entropy"], dtype=np.float64)[np.asarray(row["model_mask"], dtype=bool)]


def candidates(group: Sequence[dict], cfg: Mapping) -> list[dict]:
    """Every retained candidate of one problem's parents: its window's mean token entropy and
    its post-decay priority, P^bal of Eq. 10 once allocation is over (L_i branches on its
    parent, l_{i,b} at its boundary)."""
    branches = [(r["parent"], r["at"]) for r in group if r["kind"] == "branch"]
    out = []
    for k, row in enumerate(group):
        if row["kind"] != "parent":
            continue
        ent = model_entropy(row)
        path_count = sum(parent == k for parent, _ in branches)
        for b, p_raw in zip(row["candidates"], row["priorities"]):
            p_bal = balanced_priority(p_raw, path_count, branches.count((k, b)), cfg["rho_path"], cfg["rho_node"])
            out.append({"parent": k, "at": b, "chosen": b in row["chosen"], "entropy": float(ent[b:b + cfg["w"]].mean()),
                        "priority": float(p_bal)})
    return out


def dump_step(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


def fig2(run: Path, out: Path, label: str) -> None:
    """Entropy along one CBPO response: observation spans, retained candidate windows, chosen
    branch points."""
    path, groups, (x, k) = dump_response(run)
    row, w = groups[x][k], method_config(run)["w"]
    mask = np.asarray(row["model_mask"], dtype=bool)
    where = np.flatnonzero(mask)  # response index of each model token
    fig = figure(figsize=(10, 3.6))
    ax = fig.subplots()
    ax.plot(np.where(mask, row["entropy"], np.nan), color="C0", lw=1, label="token entropy (top-K)")
    edges = np.flatnonzero(np.diff(np.concatenate(([1], mask.astype(int), [1]))))
    for i, (start, end) in enumerate(zip(edges[::2], edges[1::2])):
        ax.axvspan(start - 0.5, end - 0.5, color="0.6", alpha=0.35, lw=0, label="tool observation" if i == 0 else None)
    for i, b in enumerate(row["candidates"]):
        end = where[min(b + w, len(where)) - 1]
        ax.axvspan(where[b] - 0.5, end + 0.5, color="C1", alpha=0.18, lw=0,
                   label=f"candidate window (w={w})" if i == 0 else None)
    for i, b in enumerate(row["chosen"]):
        ax.axvline(where[b], color="C3", ls="--", lw=1.2, label="chosen branch point" if i == 0 else None)
    none = "" if row["chosen"] else "\n(no branch point was chosen in any dumped step)"
    ax.set(xlabel="response token (model and observation)", ylabel="entropy (nats)",
           title=f"Entropy along a response: problem {row['problem']}, step {dump_step(path)}, parent {k + 1}{none}")
    ax.legend(fontsize="small", loc="upper right")
    fig.suptitle(label, fontsize="small")
    save(fig, out)


def candidate_panel(ax, cands: Sequence[dict], key: str, title: str) -> None:
    """Candidates at (boundary, parent), sized by ``key``; chosen ones filled."""
    values = np.array([c[key] for c in cands])
    sizes = 30 + 400 * values / values.max() if values.size and values.max() > 0 else np.full(values.size, 30.0)
    chosen = np.array([c["chosen"] for c in cands], dtype=bool)
    xs, ys = np.array([c["at"] for c in cands]), np.array([c["parent"] + 1 for c in cands])
    # Both kinds always in the legend: an empty "chosen" entry says none was, not that it is not drawn.
    ax.scatter(xs[~chosen], ys[~chosen], s=sizes[~chosen], facecolors="none", edgecolors="C0", label="retained, not chosen")
    ax.scatter(xs[chosen], ys[chosen], s=sizes[chosen], color="C3", alpha=0.8, label=f"chosen ({chosen.sum()})")
    for c, x, y in zip(cands, xs, ys):
        ax.annotate(f"{c[key]:.2f}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize="x-small")
    ax.set(xlabel="candidate boundary b (model token)", ylabel="parent", title=title)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(0.15)  # room for the largest markers and their labels
    ax.legend(fontsize="x-small", markerscale=0.5)


def fig5(runs: Sequence[Path], methods: Sequence[str], out: Path, label: str) -> None:
    """(a) mean reward and (b) tool calls per rollout over steps (the paper: GiGPO, ARPO, CBPO);
    (c, d) one problem's CBPO candidates sized by window entropy and by post-decay priority."""
    fig = figure(figsize=(11, 7.5))
    axes = fig.subplots(2, 2)
    for method in methods:
        plot_band(axes[0, 0], runs, method, reward)
        plot_band(axes[1, 0], runs, method, tool_calls_per_rollout)
    axes[0, 0].set(xlabel="training step", ylabel="mean reward", title=f"(a) Mean reward ({seeds_note(runs)})")
    axes[1, 0].set(xlabel="training step", ylabel="tool calls per rollout", title="(b) Tool calls per rollout")
    axes[0, 0].legend(fontsize="small")
    run = runs[0] / CBPO_RUN
    path, groups, (x, _) = dump_response(run)
    cands = candidates(groups[x], method_config(run))
    candidate_panel(axes[0, 1], cands, "entropy", "(c) CBPO candidates by window entropy")
    candidate_panel(axes[1, 1], cands, "priority", r"(d) CBPO candidates by post-decay priority $P^{\mathrm{bal}}$")
    fig.suptitle(f"{label}\n(c, d): problem {groups[x][0]['problem']}, step {dump_step(path)}", fontsize="small")
    save(fig, out)


# ----------------------------------------------------------------------------- Pass@k

def pass_at(summary: Path) -> dict[str, float]:
    data = json.loads(existing(summary).read_text())
    missing = [k for k in PASS_K if k not in data.get("pass@k", {})]
    if missing:
        raise ValueError(f"{summary}: no pass@{missing[0]} (n={data.get('n')} samples per problem; Fig. 4 needs 5)")
    return {k: 100 * float(data["pass@k"][k]) for k in PASS_K}


def fig4(summaries: Sequence[Path], summary_file: str, methods: Sequence[str], benchmarks: Sequence[str], out: Path,
         label: str) -> None:
    """Pass@1/3/5 (%) of each method (the paper: ARPO vs CBPO) on each math benchmark; each
    panel has its own y axis."""
    fig = figure(figsize=(3.2 * len(benchmarks), 3.4))
    axes = fig.subplots(1, len(benchmarks), squeeze=False)
    width = 0.8 / len(methods)
    offsets = (np.arange(len(methods)) - (len(methods) - 1) / 2) * width  # a group of bars per k
    for ax, bench in zip(axes[0], benchmarks):
        for method, offset in zip(methods, offsets):
            seeds = [pass_at(d / method / bench / summary_file) for d in summaries]
            mean, low, high = (np.array(col) for col in zip(*(mean_ci([s[k] for s in seeds]) for k in PASS_K)))
            ax.bar(np.arange(len(PASS_K)) + offset, mean, width, color=color(method), label=display_name(method),
                   yerr=np.stack((mean - low, high - mean)) if len(seeds) > 1 else None, capsize=3)
        ax.set(xticks=range(len(PASS_K)), xticklabels=[f"Pass@{k}" for k in PASS_K], ylabel="%",
               title=benchmark_config(bench)["display_name"])
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(f"Pass@k ({seeds_note(summaries)}); {label}", fontsize="small")
    save(fig, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.figures", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="figure", required=True)
    p = sub.add_parser("fig2", help="entropy along one CBPO response")
    p.add_argument("--run", type=Path, required=True, help="a CBPO run folder with a rollout dump")
    p = sub.add_parser("fig4", help="Pass@1/3/5 per math benchmark (the paper: ARPO vs CBPO)")
    p.add_argument("--summaries", type=Path, nargs="+", required=True, help="per seed: <run>/<benchmark>/ below it")
    p.add_argument("--summary-file", default="summary.json", help="below <summaries>/<run>/<benchmark>/")
    p.add_argument("--benchmarks", nargs="+", required=True)
    p = sub.add_parser("fig5", help="reward and tool calls (the paper: GiGPO, ARPO, CBPO), CBPO's candidates")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="per seed: the folder holding the runs")
    p = sub.add_parser("curves", help="training reward of every trained method")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="per seed: the folder holding the runs")
    for name, p in sub.choices.items():
        if name != "fig2":
            p.add_argument("--methods", nargs="+", required=True)
        p.add_argument("--out", type=Path, required=True, help="path without suffix (.png and .pdf are written)")
        p.add_argument("--label", default="", help="a caption naming the study")
    args = parser.parse_args(argv)
    try:
        if args.figure == "fig2":
            fig2(args.run, args.out, args.label)
        elif args.figure == "fig4":
            fig4(args.summaries, args.summary_file, args.methods, args.benchmarks, args.out, args.label)
        elif args.figure == "fig5":
            fig5(args.runs, args.methods, args.out, args.label)
        else:
            curves(args.runs, args.methods, args.out, args.label)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}.png, .pdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
