"""Credit lab (issues #14, #25, #36): where each method's token credit lands relative to the known
decisions of the fork, chain and relay tasks (``cbpo.tasks.forks``), read from its rollout dumps.

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
- at every later decision d (the chain tasks' second, the relay's four), ``p_win_d`` and
  ``win_rate_d``: the same over the rollouts that reached it below a prefix that had not lost
  yet (every earlier decision won) and sampled it themselves; and per decision ``credit_gap``:
  the mean advantage on the decision's trained tokens after the winning choice, less after a
  losing one (GRPO's is the reward gap; a method whose credit reaches the decision widens it);
- the steps to ``--target`` (0.8): per method, task and seed the first dumped step at which
  every decision's win rate reaches it, with the paired difference from GRPO;
- the entropy at decision tokens and at the other model tokens;
- where CBPO's chosen branch points fall: ``b - d``, ``d`` the parent's first decision token
  (model-token positions; a branch at ``b <= d`` samples the decision anew), beside the same
  for its retained candidates, and the share of each that falls on the first token of any
  decision (a task may have several per response); and for every branching method, where its
  branch rollouts start (their boundary ``at``), the same way, with the share of branches that
  sample a decision anew and the share that start below a prefix which already lost (they
  cannot earn a reward).

Decision tokens are the response tokens whose text overlaps a span of the task's
``decision_spans(text, question)``: the response is decoded with the run's tokenizer
(``<run>/final``) one prefix at a time up to the span's end. Questions come from the task
files under ``--data-dir`` (``paths.data_dir``), the task from the problem id's prefix;
rollouts of tasks without decisions are left out. Writes ``<out>.md``, ``<out>.csv`` (per method,
a row per task and step, ``all`` steps of each task, ``all`` of both), ``<out>.png`` and
``<out>.pdf`` (its bottom row: each decision's win rate per step, one line per method, the
band a 95% t interval over seeds, a run folder's parent naming its seed). A run without dumps or
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
from cbpo.tasks import TASKS, get_task, has_decisions
from eval.figures import color, dump_step, figure, save

def col(name: str, d: int) -> str:
    """A per-decision column: ``name`` for the first decision, ``name_d`` for decision ``d``."""
    return name if d == 1 else f"{name}_{d}"


# Decisions per response, at most, over the built-in tasks that mark them (relay: 4).
MAX_DECISIONS = max(get_task(t).N_DECISIONS for t in TASKS if has_decisions(t))
PER_DECISION = ("p_win", "win_rate", "credit_gap")
COLUMNS = ("method", "task", "step", "rollouts", "decisions_sampled", *(col(c, d) for d in range(1, MAX_DECISIONS + 1) for c in PER_DECISION),
           "reward_win", "reward_lose", "decision_token_share", "abs_adv_share", "abs_adv_per_decision_token",
           "abs_adv_per_other_token", "entropy_decision", "entropy_other", "branches", "branch_resamples", "branch_below_failed")


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
    trained = np.asarray(row["loss_mask"], dtype=bool)
    advantage = np.asarray(row["advantage"], dtype=np.float64)
    firsts, credit = [], []  # per decision: its first model token; the mean advantage on its trained tokens
    for span in spans:
        tokens = model_index[[i for i in span_tokens(tokenizer, ids, span["start"], span["end"]) if mask[i]]]
        on_decision[tokens] = True
        if not tokens.size:
            break
        firsts.append(int(tokens[0]))
        credit.append(float(advantage[tokens][trained[tokens]].mean()) if trained[tokens].any() else float("nan"))
    spans = spans[: len(firsts)]
    wins = [bool(s["wins"]) for s in spans]
    mass = np.abs(advantage) * trained
    entropy = np.asarray(row["entropy"], dtype=np.float64)[mask]
    first = firsts[0] if firsts else None
    branched = row["kind"] == "branch" and first is not None and row.get("at") is not None

    def p_win_at(token: int, wins: bool) -> float:
        if "logprob" not in row:
            return float("nan")
        p_taken = float(np.exp(row["logprob"][np.flatnonzero(mask)[token]]))
        return p_taken if wins else 1.0 - p_taken

    def resamples(b: int) -> bool:  # a branch from b samples the first decision at or after b anew
        return any(f >= b for f in firsts)

    def below_failed(b: int) -> bool:  # a decision before b already lost: the branch cannot win
        return any(f < b and not w for f, w in zip(firsts, wins))

    record = {
        "kind": row["kind"],
        "decided": bool(spans),
        "reward": float(row["reward"]),
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
        "chosen_resamples": [],
        "chosen_below_failed": [],
        # A branch's own boundary (any branching method): b - d, whether b is a decision's first
        # token, whether the branch samples a decision anew, whether its copied prefix already lost.
        "branch": [row["at"] - first] if branched else [],
        "branch_at_decision": [row["at"] in firsts] if branched else [],
        "branch_resamples": [resamples(row["at"])] if branched else [],
        "branch_below_failed": [below_failed(row["at"])] if branched else [],
    }
    for d in range(1, MAX_DECISIONS + 1):
        reached = d <= len(firsts) and all(wins[: d - 1])  # every earlier decision won: this one can still matter
        # A branch that starts after the decision copied it from its parent.
        sampled = reached and (row["kind"] != "branch" or row.get("at") is None or row["at"] <= firsts[d - 1])
        record[col("sampled", d)] = sampled
        record[col("wins", d)] = reached and wins[d - 1]
        record[col("p_win", d)] = p_win_at(firsts[d - 1], wins[d - 1]) if sampled else float("nan")
        record[col("credit", d)] = credit[d - 1] if sampled else float("nan")
    if first is not None and "chosen" in row:
        for key in ("chosen", "candidates"):
            record[key] = [b - first for b in row[key]]
            record[f"{key}_at_decision"] = [b in firsts for b in row[key]]
        record["chosen_resamples"] = [resamples(b) for b in row["chosen"]]
        record["chosen_below_failed"] = [below_failed(b) for b in row["chosen"]]
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
                records.append({"task": task, "seed": run.parent.name, "step": dump_step(path),
                                **rollout_record(row, tokenizer, spans, question)})
    if not records:
        raise ValueError(f"run {run}: its dumps hold no rollout of a task with decisions (cbpo.tasks.forks)")
    return records


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else float("nan")


def sampled_at(df: pd.DataFrame, d: int) -> tuple[pd.DataFrame, pd.Series]:
    """The records that sampled decision ``d`` below a prefix not yet lost, and whether each won it."""
    sampled = df[df[col("sampled", d)]]
    return sampled, sampled[col("wins", d)].astype(bool)


def summarise(df: pd.DataFrame) -> dict:
    decided = df[df["decided"]]
    other_tokens = df["loss_tokens"].sum() - df["decision_tokens"].sum()
    branches = [x for xs in df["branch_resamples"] for x in xs]
    out = {
        "rollouts": len(df),
        "decisions_sampled": int(df["sampled"].sum()),
        "reward_win": decided.loc[decided["wins"], "reward"].mean(),  # NaN: no rollout took it
        "reward_lose": decided.loc[~decided["wins"], "reward"].mean(),
        "decision_token_share": _ratio(df["decision_tokens"].sum(), df["loss_tokens"].sum()),
        "abs_adv_share": _ratio(df["mass_decision"].sum(), df["mass_total"].sum()),
        "abs_adv_per_decision_token": _ratio(df["mass_decision"].sum(), df["decision_tokens"].sum()),
        "abs_adv_per_other_token": _ratio(df["mass_total"].sum() - df["mass_decision"].sum(), other_tokens),
        "entropy_decision": _ratio(df["entropy_decision_sum"].sum(), df["entropy_decision_n"].sum()),
        "entropy_other": _ratio(df["entropy_other_sum"].sum(), df["entropy_other_n"].sum()),
        "branches": len(branches),
        "branch_resamples": float(np.mean(branches)) if branches else float("nan"),
        "branch_below_failed": float(np.mean([x for xs in df["branch_below_failed"] for x in xs])) if branches else float("nan"),
    }
    for d in range(1, MAX_DECISIONS + 1):
        sampled, won = sampled_at(df, d)
        out[col("p_win", d)] = sampled[col("p_win", d)].mean()  # NaN (dumps without log-probs) is left out
        out[col("win_rate", d)] = _ratio(won.sum(), len(sampled))
        # the advantage a winning choice's tokens get, less a losing one's: > 0 credits the right choice
        out[col("credit_gap", d)] = _mean(sampled.loc[won, col("credit", d)].dropna()) - _mean(sampled.loc[~won, col("credit", d)].dropna())
    return out


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


def accuracy_by_seed(records: dict[str, list[dict]]) -> pd.DataFrame:
    """Per method, task, seed (the run folder's parent, ``seed<N>``) and dumped step: each
    decision's win rate (``d1`` ...) over the rollouts that sampled it below a prefix that
    had not lost yet."""
    rows = []
    for method, recs in records.items():
        for (task, seed, step), part in pd.DataFrame(recs).groupby(["task", "seed", "step"]):
            row = {"method": method, "task": task, "seed": seed, "step": int(step)}
            for d in range(1, get_task(task).N_DECISIONS + 1):
                _, won = sampled_at(part, d)
                row[f"d{d}"] = _ratio(won.sum(), len(won))
            rows.append(row)
    return pd.DataFrame(rows)


def steps_to(accuracy: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per method, task and seed: the first dumped step at which every decision's win rate
    reaches ``target`` (``reached`` False: never, and ``step`` is one past the last dumped)."""
    rows = []
    for (method, task, seed), part in accuracy.groupby(["method", "task", "seed"], sort=False):
        part = part.sort_values("step")
        decisions = [f"d{d}" for d in range(1, get_task(task).N_DECISIONS + 1)]
        hit = part.loc[(part[decisions] >= target).all(axis=1), "step"]
        rows.append({"method": method, "task": task, "seed": seed, "reached": not hit.empty,
                     "step": int(hit.iloc[0]) if not hit.empty else int(part["step"].max()) + 1})
    return pd.DataFrame(rows)


def steps_table(steps: pd.DataFrame, target: float, reference: str = "grpo") -> pd.DataFrame:
    """Per method and task: the steps to ``target`` by seed (``>N``: not reached by the last
    dumped step, counted as N), their median, and the paired difference from ``reference``
    over the seeds both have (mean, 95% t half-width)."""
    from eval.report import ci95

    rows = []
    for (method, task), part in steps.groupby(["method", "task"], sort=False):
        by_seed = part.set_index("seed")
        row = {"method": method, "task": task,
               "steps by seed": " / ".join(f"{s}" if r else f">{s - 1}" for s, r in zip(part["step"], part["reached"])),
               f"median steps to {target:g}": f"{part['step'].median():g}"}
        ref = steps[(steps["method"] == reference) & (steps["task"] == task)].set_index("seed")["step"]
        diff = (by_seed["step"] - ref).dropna()
        if method != reference and len(diff):
            row[f"- {reference}"] = f"{diff.mean():+.1f} ± {ci95(diff.tolist()):.1f}" if len(diff) > 1 else f"{diff.mean():+.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


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
                     "median b - d": np.median(d),
                     "chosen resampling a decision": np.mean([x for r in records[method] for x in r["chosen_resamples"]]),
                     "chosen below a lost prefix": np.mean([x for r in records[method] for x in r["chosen_below_failed"]]),
                     "candidates": c.size, "candidates at or before d": np.mean(c <= 0),
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
                         "median b - d": np.median(d),
                         "resampling a decision": np.mean([x for r in recs for x in r["branch_resamples"]]),
                         "below a lost prefix": np.mean([x for r in recs for x in r["branch_below_failed"]])})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, chosen: dict[str, np.ndarray], accuracy: pd.DataFrame, out: Path, label: str) -> None:
    from eval.report import ci95

    decisions = max(get_task(t).N_DECISIONS for t in accuracy["task"].unique())
    fig = figure(figsize=(max(12, 3.4 * decisions), 7.2))
    top, bottom = fig.subfigures(2, 1)
    ax_credit, ax_win, ax_dist = top.subplots(1, 3)
    overall = table[table["task"] == "all"]
    x = np.arange(len(overall))
    ax_credit.bar(x - 0.2, overall["decision_token_share"], 0.4, label="decision tokens' share of tokens")
    ax_credit.bar(x + 0.2, overall["abs_adv_share"], 0.4, label="their share of |advantage|")
    ax_credit.set(xticks=x, xticklabels=overall["method"], ylabel="share of the loss tokens' total",
                  title="(a) credit on decision tokens")
    ax_credit.tick_params(axis="x", labelrotation=30)
    ax_credit.legend(fontsize="small")
    # One colour per method and task: the probability solid, the sampled outcome dotted behind it.
    for (method, task), part in table[table["step"] != "all"].groupby(["method", "task"], sort=False):
        step = part["step"].astype(int)
        (line,) = ax_win.plot(step, part["p_win"], marker=".", label=f"{method}, {task}")
        ax_win.plot(step, part["win_rate"], linestyle=":", color=line.get_color(), alpha=0.6)
    ax_win.set(xlabel="step", ylabel="P(winning choice) at the decision token", ylim=(0, 1),
               title="(b) first decision: p_win (solid), win rate (dotted)")
    ax_win.legend(fontsize="small")
    for method, d in chosen.items():
        ax_dist.hist(d, bins=np.arange(d.min() - 0.5, d.max() + 1.5), alpha=0.6, label=method)
    ax_dist.axvline(0, color="black", linewidth=0.8)
    ax_dist.set(xlabel="chosen branch point b - first decision token d", ylabel="count",
                title="(c) chosen branch points" if chosen else "(c) no branch annotations in the dumps")
    if chosen:
        ax_dist.legend(fontsize="small")
    # Per decision: the win rate per step, mean over seeds, with its 95% t band.
    axes = np.atleast_1d(bottom.subplots(1, decisions, sharey=True))
    styles = dict(zip(accuracy["task"].unique(), ("-", "--", ":", "-.")))
    for (method, task), part in accuracy.groupby(["method", "task"], sort=False):
        for d, ax in enumerate(axes, 1):
            if f"d{d}" not in part or part[f"d{d}"].isna().all():
                continue
            by_step = part.groupby("step")[f"d{d}"]
            mean = by_step.mean()
            (line,) = ax.plot(mean.index, mean.values, lw=1.6, marker=".", color=color(method), linestyle=styles[task],
                              label=f"{method}, {task}")
            half = by_step.agg(lambda v: ci95(v.dropna().tolist()))
            if half.notna().any():
                ax.fill_between(mean.index, mean - half, mean + half, color=line.get_color(), alpha=0.15, lw=0)
    for d, ax in enumerate(axes, 1):
        ax.set(xlabel="step", ylim=(0, 1.02), title=f"({chr(ord('c') + d)}) decision {d}: win rate")
    axes[0].set_ylabel("win rate below a prefix not yet lost")
    axes[0].legend(fontsize="small")
    fig.suptitle(label, fontsize="small")
    save(fig, out)


def write(records: dict[str, list[dict]], out: Path, label: str, target: float = 0.8) -> None:
    table = credit_table(records)
    chosen = distances(records, "chosen")
    accuracy = accuracy_by_seed(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(f"{out}.csv", index=False)
    overall = table[table["step"] == "all"].drop(columns="step")
    per_step = table[table["step"] != "all"]
    without_logprobs = [m for m, part in overall.groupby("method", sort=False) if part["p_win"].isna().all()]
    parts = [
        f"# Credit lab{': ' + label if label else ''}", "",
        "Decision tokens: where each rollout chooses an action at one of its task's decisions (cbpo.tasks.forks: the "
        "first action, then the first action after each observation, up to the task's N_DECISIONS). p_win, win_rate "
        "and the branch points' b - d are taken at the first decision; p_win_d and win_rate_d at decision d, over "
        "the rollouts that reached it below a prefix that had not lost yet (every earlier decision won) and sampled it "
        "themselves (a branch that starts after a decision copied it). abs_adv_share: the decision tokens' "
        "share of the |advantage| mass under the loss mask, beside decision_token_share (their share of the loss "
        "tokens). credit_gap_d: the mean advantage on decision d's trained tokens after the winning choice, less "
        "after a losing one. p_win: the mean probability of the winning "
        "choice at the decision's first token under the policy (its raw, temperature-1 distribution, whatever the "
        "sampling temperature), from the sampled token's log-prob lp: exp(lp) after the winning choice, 1 - exp(lp) "
        "after a losing one; exact when that token chooses between two options, an estimate otherwise. win_rate: "
        "the share of those rollouts that took the winning choice. reward_win, reward_lose: the mean reward of the "
        "rollouts that took the winning choice at the first decision, and another (branches that copied their "
        "parent's choice included). branches: the branch rollouts of any branching method; branch_resamples: the "
        "share that samples a decision anew (it starts at or before one); branch_below_failed: the share whose "
        "copied prefix already took a losing choice, so it cannot earn a reward.", "",
    ]
    if without_logprobs:
        parts += [f"The dumps of {', '.join(without_logprobs)} hold no log-probs (written before they were kept): "
                  "p_win is NaN there.", ""]
    parts += [overall.dropna(axis=1, how="all").to_markdown(index=False, floatfmt=".4f"), ""]
    to_target = steps_table(steps_to(accuracy, target), target)
    parts += [f"## Steps to {target:g} on every decision", "",
              f"Per seed, the first dumped step at which every decision's win rate reaches {target:g} (>N: not by the "
              "last dumped step N, counted as N + 1); the difference from GRPO is paired by seed (mean ± 95% t "
              "half-width).", "", to_target.fillna("").to_markdown(index=False, disable_numparse=True), ""]
    sections = [("Decision-token probability (p_win) per step", "p_win"), ("Win rate per step", "win_rate")]
    sections += [(f"Decision {d}: {name} per step", col(column, d)) for d in range(2, MAX_DECISIONS + 1)
                 for name, column in (("p_win", "p_win"), ("win rate", "win_rate"))]
    sections += [("Branches that sample a decision anew, per step", "branch_resamples"),
                 ("Branches below a prefix that already lost, per step", "branch_below_failed")]
    for title, column in sections:
        if per_step[column].isna().all():
            continue
        steps = per_step.pivot(index="step", columns=["method", "task"], values=column)[list(records)].dropna(axis=1, how="all")
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
    plot(table, chosen, accuracy, out, label)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.credit_lab", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="run folders runs/<key>/<method>")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix (.md, .csv, .png, .pdf)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="the task files (paths.data_dir)")
    parser.add_argument("--label", default="", help="a caption naming the study")
    parser.add_argument("--target", type=float, default=0.8, help="the win rate every decision must reach (steps to it)")
    args = parser.parse_args(argv)
    records: dict[str, list[dict]] = {}
    try:
        for run in args.runs:
            records.setdefault(run.name, []).extend(run_records(run, args.data_dir))
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(records, args.out, args.label, args.target)
    print(f"wrote {args.out}.md, .csv, .png, .pdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
