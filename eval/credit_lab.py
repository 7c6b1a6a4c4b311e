"""Credit lab (issues #14, #25): where each method's token credit lands relative to the known
decisions of the fork and chain tasks (``cbpo.tasks.forks``), read from its rollout dumps.

    python -m eval.credit_lab --runs runs/S/seed0/grpo runs/S/seed0/cbpo --out results/credit/S/credit_lab

A method is a run folder's name; the folders of one method (seeds) are pooled. Over every
``<run>/rollouts/step_*.jsonl`` (``rl.dump_rollouts=true``) it measures:

- credit on decisions: the share of the |advantage| mass (model tokens under the loss mask)
  on decision tokens, beside those tokens' share of the loss tokens: the two are equal for a
  method whose credit ignores where the decision is (GRPO's is constant along a response);
- the decision-token probability per step, ``p_win``: over the rollouts that sampled their
  decision themselves (every rollout but a branch that copied it), the mean probability of
  the winning choice at the decision's first token, from the sampled token's log-prob ``lp``
  (the raw policy's, as the engine returned it): ``exp(lp)`` if the rollout took the winning
  choice, else ``1 - exp(lp)``. Exact where that token chooses between two options (an action
  tag against the other), an estimate otherwise. Dumps written before log-probs were kept give
  NaN;
- the win rate per step: the fraction of those rollouts that took the winning choice, and the
  mean reward of the rollouts (all with a decision) that took the winning choice and of those
  that took another: RL can only move a decision whose winning choice earns more reward than
  the others, so a low ``reward_win`` says the policy cannot yet finish what the choice starts;
- on the chain tasks, ``p_win_2`` and ``win_rate_2``: the same at the second decision (after
  the first tool observation), over the rollouts that reached it and sampled it themselves;
- the entropy at decision tokens and at the other model tokens;
- where CBPO's chosen branch points fall: ``b - d``, ``d`` the parent's first decision token
  (model-token positions; a branch at ``b <= d`` samples the decision anew), beside the same
  for its retained candidates, and the share of each that falls on the first token of any
  decision (a task may have several per response); and for every branching method, where its
  branch rollouts start (their boundary ``at``), the same way.

Decision tokens are the response tokens whose text overlaps a span of the task's
``decision_spans(text, question)``: the response is decoded with the run's tokenizer
(``<run>/final``) one prefix at a time up to the span's end. Questions come from the task
files under ``--data-dir`` (``paths.data_dir``), the task from the problem id's prefix;
rollouts of tasks without decisions are left out. Writes ``<out>.md``, ``<out>.csv`` (per method,
a row per task and step, ``all`` steps of each task, ``all`` of both), ``<out>.png`` and
``<out>.pdf``. A run without dumps or
tokenizer, or without any fork-task rollout, is an error naming it (exit 2).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from cbpo.data import read_jsonl, read_rows, task_file
from cbpo.tasks import get_task, has_decisions
from eval.figures import dump_step, figure, save

COLUMNS = ("method", "task", "step", "rollouts", "decisions_sampled", "p_win", "win_rate", "reward_win", "reward_lose",
           "decision_token_share",
           "abs_adv_share", "abs_adv_per_decision_token", "abs_adv_per_other_token", "entropy_decision", "entropy_other", "p_win_2", "win_rate_2")


def span_tokens(tokenizer, ids: Sequence[int], start: int, end: int) -> list[int]:
    """Indices of the tokens of ``ids`` whose decoded text overlaps characters ``[start, end)``
    of ``tokenizer.decode(ids)``. Prefixes are decoded, not single tokens, and a byte-level
    token that holds only part of a character (the prefix decodes to a trailing U+FFFD) goes
    with the token that completes the character."""
    tokens, pending, before = [], [], 0
    for i in range(len(ids)):
        if before >= end:
            break
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        if text.endswith("\ufffd") and i + 1 < len(ids):
            pending.append(i)
            continue
        if len(text) > max(before, start):
            tokens += pending + [i]
        pending, before = [], len(text)
    return tokens


def fork_questions(data_dir: Path) -> Callable[[str], tuple[str, Callable, str] | None]:
    """``lookup(problem_id)``: the problem's task, the task's ``decision_spans`` and the
    problem's question, or None for a task without decisions. Task files are read once, on
    first use."""
    cache: dict[str, dict[str, str]] = {}

    def lookup(problem: str):
        task = problem.split("-", 1)[0]
        if not has_decisions(task):
            return None
        spans = get_task(task).decision_spans
        if task not in cache:
            cache[task] = {row["id"]: row["question"] for row in read_rows(task_file(data_dir, task, "train"))}
        if problem not in cache[task]:
            raise KeyError(f"problem {problem!r} is not in {task_file(data_dir, task, 'train')}")
        return task, spans, cache[task][problem]

    return lookup


def rollout_record(row: dict, tokenizer, decision_spans: Callable, question: str) -> dict:
    """One dumped rollout, measured against its decisions (found in its ``text``, the dump's
    decoding of ``response_ids``)."""
    ids = row["response_ids"]
    spans = decision_spans(row["text"], question)
    mask = np.asarray(row["model_mask"], dtype=bool)
    model_index = np.cumsum(mask) - 1
    on_decision = np.zeros(int(mask.sum()), dtype=bool)
    firsts = []  # each decision's first model token, in order
    for span in spans:
        tokens = [i for i in span_tokens(tokenizer, ids, span["start"], span["end"]) if mask[i]]
        on_decision[model_index[tokens]] = True
        firsts += [int(model_index[tokens[0]])] if tokens else []
    starts = set(firsts)
    trained = np.asarray(row["loss_mask"], dtype=bool)
    mass = np.abs(np.asarray(row["advantage"], dtype=np.float64)) * trained
    entropy = np.asarray(row["entropy"], dtype=np.float64)[mask]
    first = int(np.argmax(on_decision)) if on_decision.any() else None
    wins = bool(spans) and spans[0]["wins"]

    def p_win_at(token: int | None, wins: bool) -> float:
        if token is None or "logprob" not in row:
            return float("nan")
        p_taken = float(np.exp(row["logprob"][np.flatnonzero(mask)[token]]))
        return p_taken if wins else 1.0 - p_taken

    second = firsts[1] if len(spans) > 1 and len(firsts) > 1 else None
    second_wins = second is not None and spans[1]["wins"]
    branched = row["kind"] == "branch" and first is not None and row.get("at") is not None
    record = {
        "kind": row["kind"],
        # A branch that starts after the decision copied it from its parent.
        "sampled": row["kind"] != "branch" or first is None or row["at"] <= first,
        "decided": bool(spans),
        "wins": wins,
        "reward": float(row["reward"]),
        "p_win": p_win_at(first, wins),
        # The chain tasks' second decision, after the first observation (None: not reached).
        "second_sampled": second is not None and (row["kind"] != "branch" or row["at"] <= second),
        "second_wins": second_wins,
        "p_win_2": p_win_at(second, second_wins),
        "loss_tokens": int(trained.sum()),
        "decision_tokens": int((trained & on_decision).sum()),
        "mass_decision": float(mass[on_decision].sum()),
        "mass_total": float(mass.sum()),
        "entropy_decision_sum": float(entropy[on_decision].sum()),
        "entropy_decision_n": int(on_decision.sum()),
        "entropy_other_sum": float(entropy[~on_decision].sum()),
        "entropy_other_n": int((~on_decision).sum()),
        "chosen": [],
        "candidates": [],
        "chosen_at_decision": [],
        "candidates_at_decision": [],
        # A branch's own boundary (any branching method): b - d and whether b is a decision's first token.
        "branch": [row["at"] - first] if branched else [],
        "branch_at_decision": [row["at"] in starts] if branched else [],
    }
    if first is not None and "chosen" in row:
        for key in ("chosen", "candidates"):
            record[key] = [b - first for b in row[key]]
            record[f"{key}_at_decision"] = [b in starts for b in row[key]]
    return record


def run_records(run: Path, data_dir: Path) -> list[dict]:
    """Every fork-task rollout of a run's dumps, with its step."""
    dumps = sorted((run / "rollouts").glob("step_*.jsonl"))
    if not dumps:
        raise FileNotFoundError(f"run {run} has no rollout dumps ({run / 'rollouts'}/step_*.jsonl; "
                                "train with rl.dump_rollouts=true)")
    if not (run / "final").is_dir():
        raise FileNotFoundError(f"run {run} has no tokenizer at {run / 'final'} (the run is not finished)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    lookup = fork_questions(data_dir)
    records = []
    for path in dumps:
        for _, row in read_jsonl(path):
            found = lookup(row["problem"])
            if found is not None:
                task, spans, question = found
                records.append({"task": task, "step": dump_step(path), **rollout_record(row, tokenizer, spans, question)})
    if not records:
        raise ValueError(f"run {run}: its dumps hold no rollout of a task with decisions (cbpo.tasks.forks)")
    return records


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def summarise(df: pd.DataFrame) -> dict:
    sampled, decided = df[df["sampled"]], df[df["decided"]]
    other_tokens = df["loss_tokens"].sum() - df["decision_tokens"].sum()
    return {
        "rollouts": len(df),
        "decisions_sampled": len(sampled),
        "p_win": sampled["p_win"].mean(),  # NaN (dumps without log-probs) is left out
        "win_rate": _ratio(sampled["wins"].sum(), len(sampled)),
        "p_win_2": df.loc[df["second_sampled"], "p_win_2"].mean(),
        "win_rate_2": _ratio(df.loc[df["second_sampled"], "second_wins"].sum(), int(df["second_sampled"].sum())),
        "reward_win": decided.loc[decided["wins"], "reward"].mean(),  # NaN: no rollout took it
        "reward_lose": decided.loc[~decided["wins"], "reward"].mean(),
        "decision_token_share": _ratio(df["decision_tokens"].sum(), df["loss_tokens"].sum()),
        "abs_adv_share": _ratio(df["mass_decision"].sum(), df["mass_total"].sum()),
        "abs_adv_per_decision_token": _ratio(df["mass_decision"].sum(), df["decision_tokens"].sum()),
        "abs_adv_per_other_token": _ratio(df["mass_total"].sum() - df["mass_decision"].sum(), other_tokens),
        "entropy_decision": _ratio(df["entropy_decision_sum"].sum(), df["entropy_decision_n"].sum()),
        "entropy_other": _ratio(df["entropy_other_sum"].sum(), df["entropy_other_n"].sum()),
    }


def credit_table(records: dict[str, list[dict]]) -> pd.DataFrame:
    """Per method: a row per task and step, each task's ``all`` steps, then the method's
    ``all`` tasks and steps."""
    rows = []
    for method, recs in records.items():
        df = pd.DataFrame(recs)
        for task, part in df.groupby("task"):
            rows += [{"method": method, "task": task, "step": step, **summarise(p)} for step, p in part.groupby("step")]
            rows.append({"method": method, "task": task, "step": "all", **summarise(part)})
        rows.append({"method": method, "task": "all", "step": "all", **summarise(df)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def distances(records: dict[str, list[dict]], key: str) -> dict[str, np.ndarray]:
    """Per method with branch annotations: ``b - d`` of every chosen point (or candidate)."""
    out = {m: np.asarray([x for r in recs for x in r[key]], dtype=int) for m, recs in records.items()}
    return {m: d for m, d in out.items() if d.size}


def distance_table(records: dict[str, list[dict]]) -> pd.DataFrame:
    """Per method with branch annotations: where its chosen points and candidates fall against
    the first decision token ``d``, and the share of them on any decision's first token."""
    chosen, candidates = distances(records, "chosen"), distances(records, "candidates")
    at_decision = {key: {m: np.mean([x for r in recs for x in r[f"{key}_at_decision"]] or [np.nan])
                         for m, recs in records.items()} for key in ("chosen", "candidates")}
    rows = []
    for method, d in chosen.items():
        c = candidates[method]
        rows.append({"method": method, "chosen": d.size, "chosen at or before d": np.mean(d <= 0),
                     "chosen at d": np.mean(d == 0), "chosen at a decision": at_decision["chosen"][method],
                     "median b - d": np.median(d), "candidates": c.size, "candidates at or before d": np.mean(c <= 0),
                     "candidates at a decision": at_decision["candidates"][method]})
    return pd.DataFrame(rows)


def branch_table(records: dict[str, list[dict]]) -> pd.DataFrame:
    """Per branching method (ARPO, Tree-GRPO, CBPO, ...): where its branches start, ``b - d``
    against the first decision token ``d``, and the share on any decision's first token (a
    branch there samples that decision anew)."""
    rows = []
    for method, recs in records.items():
        d = np.asarray([x for r in recs for x in r["branch"]], dtype=int)
        if d.size:
            rows.append({"method": method, "branches": d.size, "at or before d": np.mean(d <= 0), "at d": np.mean(d == 0),
                         "at a decision": np.mean([x for r in recs for x in r["branch_at_decision"]]),
                         "median b - d": np.median(d)})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, chosen: dict[str, np.ndarray], out: Path, label: str) -> None:
    fig = figure(figsize=(12, 3.6))
    ax_credit, ax_win, ax_dist = fig.subplots(1, 3)
    overall = table[table["task"] == "all"]
    x = np.arange(len(overall))
    ax_credit.bar(x - 0.2, overall["decision_token_share"], 0.4, label="decision tokens' share of tokens")
    ax_credit.bar(x + 0.2, overall["abs_adv_share"], 0.4, label="their share of |advantage|")
    ax_credit.set(xticks=x, xticklabels=overall["method"], ylabel="share of the loss tokens' total",
                  title="(a) credit on decision tokens")
    ax_credit.legend(fontsize="small")
    # One colour per method and task: the probability solid, the sampled outcome dotted behind it.
    for (method, task), part in table[table["step"] != "all"].groupby(["method", "task"], sort=False):
        step = part["step"].astype(int)
        (line,) = ax_win.plot(step, part["p_win"], marker=".", label=f"{method}, {task}")
        ax_win.plot(step, part["win_rate"], linestyle=":", color=line.get_color(), alpha=0.6)
    ax_win.set(xlabel="step", ylabel="P(winning choice) at the decision token", ylim=(0, 1),
               title="(b) p_win (solid), win rate (dotted)")
    ax_win.legend(fontsize="small")
    for method, d in chosen.items():
        ax_dist.hist(d, bins=np.arange(d.min() - 0.5, d.max() + 1.5), alpha=0.6, label=method)
    ax_dist.axvline(0, color="black", linewidth=0.8)
    ax_dist.set(xlabel="chosen branch point b - first decision token d", ylabel="count",
                title="(c) chosen branch points" if chosen else "(c) no branch annotations in the dumps")
    if chosen:
        ax_dist.legend(fontsize="small")
    fig.suptitle(label, fontsize="small")
    save(fig, out)


def write(records: dict[str, list[dict]], out: Path, label: str) -> None:
    table = credit_table(records)
    chosen = distances(records, "chosen")
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(f"{out}.csv", index=False)
    overall = table[table["step"] == "all"].drop(columns="step")
    per_step = table[table["step"] != "all"]
    without_logprobs = [m for m, part in overall.groupby("method", sort=False) if part["p_win"].isna().all()]
    parts = [
        f"# Credit lab{': ' + label if label else ''}", "",
        "Decision tokens: where each rollout chooses an action at one of its task's decisions (cbpo.tasks.forks: the "
        "first action; on the chain tasks also the first action after the first observation). p_win, win_rate and "
        "the branch points' b - d are taken at the first decision; p_win_2 and win_rate_2 the same at the second, over "
        "the rollouts that reached it and sampled it themselves. abs_adv_share: their "
        "share of the |advantage| mass under the loss mask, beside decision_token_share (their share of the loss "
        "tokens). p_win: over the rollouts that sampled their decision, the mean probability of the winning "
        "choice at the decision's first token under the policy (its raw, temperature-1 distribution, whatever the "
        "sampling temperature), from the sampled token's log-prob lp: exp(lp) after the winning choice, 1 - exp(lp) "
        "after the losing one; exact when that token chooses between two options, an estimate otherwise. win_rate: "
        "the share of those rollouts that took the winning choice. reward_win, reward_lose: the mean reward of the "
        "rollouts that took the winning choice, and another (branches that copied their parent's choice included).", "",
    ]
    if without_logprobs:
        parts += [f"The dumps of {', '.join(without_logprobs)} hold no log-probs (written before they were kept): "
                  "p_win is NaN there.", ""]
    parts += [overall.to_markdown(index=False, floatfmt=".4f"), ""]
    for title, column in (("Decision-token probability (p_win) per step", "p_win"), ("Win rate per step", "win_rate"),
                          ("Second decision (after the first observation): p_win_2 per step", "p_win_2"),
                          ("Second decision: win rate per step", "win_rate_2")):
        if per_step[column].isna().all():
            continue
        steps = per_step.pivot(index="step", columns=["method", "task"], values=column)[list(records)]
        steps.columns = [f"{method}, {task}" for method, task in steps.columns]
        parts += [f"## {title}", "", steps.to_markdown(floatfmt=".3f"), ""]
    branches = branch_table(records)
    if not branches.empty:
        parts += ["## Where branches start (b - d, model tokens; every branch rollout)", "",
                  branches.to_markdown(index=False, floatfmt=".3f"), ""]
    if chosen:
        parts += ["## Chosen branch points relative to the decision (b - d, model tokens)", "",
                  distance_table(records).to_markdown(index=False, floatfmt=".3f"), ""]
    Path(f"{out}.md").write_text("\n".join(parts))
    plot(table, chosen, out, label)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.credit_lab", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="run folders runs/<key>/<method>")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix (.md, .csv, .png, .pdf)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="the task files (paths.data_dir)")
    parser.add_argument("--label", default="", help="a caption naming the study")
    args = parser.parse_args(argv)
    records: dict[str, list[dict]] = {}
    try:
        for run in args.runs:
            records.setdefault(run.name, []).extend(run_records(run, args.data_dir))
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(records, args.out, args.label)
    print(f"wrote {args.out}.md, .csv, .png, .pdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
