"""JSON contracts of ``python -m cbpo allocate|credit`` (stable public interfaces).

``allocate IN.json`` prints the Stage-1 branch plan of every problem; ``credit IN.jsonl``
prints per-model-token advantages and loss masks, one line per input rollout, in input order.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from cbpo.branching import plan_branches
from cbpo.config import CBPOConfig
from cbpo.credit import ProblemRollouts, assign_credit

ALLOCATE_KEYS = {"w", "d_min", "top_j", "alpha", "gamma", "kappa", "rho_path", "rho_node", "b_node", "b_path", "candidates"}


class InputError(ValueError):
    """Bad user input; the message names the problem."""


def _read_json(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


def _require(obj: dict, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    return obj[key]


def allocate(doc: dict) -> dict:
    overrides = doc.get("config") or {}
    bad = sorted(set(overrides) - ALLOCATE_KEYS)
    if bad:
        raise InputError(f"config: unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(ALLOCATE_KEYS))}")
    budget = _require(doc, "budget", "input")
    if not isinstance(budget, int) or budget < 1:
        raise InputError(f"budget must be a positive integer, got {budget!r}")
    try:
        cfg = CBPOConfig.from_overrides(overrides, CBPOConfig(budget=budget, n0=1))
    except (ValueError, TypeError) as e:
        raise InputError(f"config: {e}") from None
    out = []
    for x, prob in enumerate(_require(doc, "problems", "input")):
        where = f"problems[{x}]"
        parents = _require(prob, "parents", where)
        if len(parents) > budget:
            raise InputError(f"{where}: {len(parents)} parents exceed the budget M={budget}")
        try:
            entropies = [np.asarray(_require(p, "token_entropy", f"{where}.parents[{i}]"), dtype=np.float64) for i, p in enumerate(parents)]
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: token_entropy must be a list of numbers ({e})") from None
        plan = plan_branches(
            entropies,
            int(_require(prob, "vocab_size", where)),
            cfg,
            tool_boundaries=[p.get("tool_boundaries") for p in parents],
            budget=budget,
        )
        out.append({
            "id": prob.get("id", x),
            "branches": [{"parent": parents[i].get("id", i), "at": b} for i, b in plan.branches],
            "fill": plan.fill,
        })
    return {"problems": out}


def _problems_from_lines(rows: list[dict]) -> tuple[list[ProblemRollouts], list[tuple[int, int]]]:
    """Group JSONL rollouts by problem (first-appearance order); return where each row went."""
    by_problem: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        for key in ("problem", "id", "kind", "reward", "n_tokens"):
            _require(row, key, f"line {i + 1}")
        by_problem.setdefault(row["problem"], []).append(i)
    problems, where = [], [(0, 0)] * len(rows)
    for x, idx in enumerate(by_problem.values()):
        ids = {rows[i]["id"]: k for k, i in enumerate(idx)}
        if len(ids) != len(idx):
            raise InputError(f"problem {rows[idx[0]]['problem']!r}: duplicate rollout ids")
        parent, at = [], []
        for i in idx:
            row = rows[i]
            if row["kind"] == "branch":
                if row.get("parent") not in ids:
                    raise InputError(f"line {i + 1}: branch parent {row.get('parent')!r} is not a rollout of problem {row['problem']!r}")
                if not isinstance(row.get("at"), int):
                    raise InputError(f"line {i + 1}: a branch needs an integer 'at'")
                parent.append(ids[row["parent"]])
                at.append(row["at"])
            else:
                parent.append(-1)
                at.append(-1)
        for k, i in enumerate(idx):
            where[i] = (x, k)
        try:
            problems.append(ProblemRollouts(
                rewards=[float(rows[i]["reward"]) for i in idx],
                kinds=[rows[i]["kind"] for i in idx],
                parent=parent,
                at=at,
                n_tokens=[int(rows[i]["n_tokens"]) for i in idx],
            ))
        except (TypeError, ValueError) as e:
            raise InputError(f"problem {rows[idx[0]]['problem']!r}: {e}") from None
    return problems, where


def credit(rows: list[dict], overrides: dict | None = None) -> Iterable[dict]:
    try:
        cfg = CBPOConfig.from_overrides(overrides)
    except (ValueError, TypeError) as e:
        raise InputError(f"--config: {e}") from None
    problems, where = _problems_from_lines(rows)
    result = assign_credit(problems, cfg)
    for row, (x, k) in zip(rows, where):
        yield {
            "id": row["id"],
            "advantage": result.advantages[x][k].tolist(),
            "loss_mask": result.loss_masks[x][k].astype(int).tolist(),
        }


def read_jsonl(path: str) -> list[dict]:
    try:
        lines = (sys.stdin if path == "-" else open(path)).read().splitlines()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not valid JSON ({e})") from None
    return rows
