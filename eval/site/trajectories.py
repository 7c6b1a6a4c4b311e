"""The trajectory viewer's data: each rollout dump of a run (``rollouts/step_*.jsonl``, written
with ``rl.dump_rollouts=true``) as a script the viewer loads from the site's own folder.

A browser opening ``file://`` pages refuses to fetch JSON beside them, but runs a ``<script>``:
so every dump becomes ``data/<run>/step_<N>.js``, one call ``CBPO_SITE.dump({...})``, and
``data/manifest.js`` lists the runs, their steps and each step's problems. Tokens are the run's
own tokenizer's pieces, decoded one id at a time, so a token's colour and tooltip sit on exactly
the text the model sampled.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer

from cbpo.data import read_jsonl

# Kept of every rollout; CBPO's parents add their annotations (candidate windows start at a
# model-token boundary b, Eq. 5; chosen nodes with their CBV, Eq. 14).
ROLLOUT_FIELDS = ("kind", "parent", "at", "reward", "finish", "tool_calls", "model_mask", "entropy", "logprob",
                  "advantage", "loss_mask")
CBPO_FIELDS = ("candidates", "priorities", "chosen", "nodes")


def dumps(run: Path) -> list[Path]:
    """A run's rollout dumps, oldest step first."""
    return sorted((run / "rollouts").glob("step_*.jsonl"))


def step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


def problem_sets(path: Path) -> list[tuple[str, list[dict]]]:
    """A dump's rollouts per problem, in the dump's order (a problem's set R_x is contiguous and
    ``parent`` indexes into it)."""
    sets: list[tuple[str, list[dict]]] = []
    for _, row in read_jsonl(path):
        if not sets or sets[-1][0] != row["problem"]:
            sets.append((row["problem"], []))
        sets[-1][1].append(row)
    return sets


class Pieces:
    """Each token id's text under a run's tokenizer (``final/tokenizer.json``), memoised."""

    def __init__(self, run: Path):
        path = run / "final" / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"missing input file {path}")
        self.tokenizer, self.cache = Tokenizer.from_file(str(path)), {}

    def __call__(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            if i not in self.cache:
                self.cache[i] = self.tokenizer.decode([i], skip_special_tokens=False)
            out.append(self.cache[i])
        return out


def rollout(row: dict, pieces: Pieces) -> dict:
    kept = {k: row[k] for k in (*ROLLOUT_FIELDS, *CBPO_FIELDS) if k in row}
    return {**kept, "tokens": pieces(row["response_ids"])}


def window(run: Path) -> int | None:
    """CBPO's window size w (Eq. 6) from the run's run_key.json; None for a method without one."""
    key = run / "run_key.json"
    return json.loads(key.read_text())["method"].get("w") if key.is_file() else None


def write_run(run: Path, name: str, out: Path, max_problems: int) -> list[dict]:
    """Every dump of ``run`` as ``out/data/<name>/step_<N>.js``; the manifest's entries for it.
    Each step keeps its first ``max_problems`` problems (a paper-scale dump holds hundreds)."""
    pieces, w, steps = Pieces(run), window(run), []
    for path in dumps(run):
        sets = problem_sets(path)[:max_problems]
        doc = {"run": name, "step": step_of(path), "w": w,
               "problems": [{"id": pid, "rollouts": [rollout(r, pieces) for r in rows]} for pid, rows in sets]}
        target = out / "data" / name / f"{path.stem}.js"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"CBPO_SITE.dump({json.dumps(doc, separators=(',', ':'))});\n")
        steps.append({"step": doc["step"], "file": target.relative_to(out).as_posix(),
                      "problems": [{"id": pid, "rollouts": len(rows), "branches": sum(r["kind"] == "branch" for r in rows)}
                                   for pid, rows in sets]})
    return steps


def write_trajectories(runs: Sequence[tuple[str, Path]], out: Path, max_problems: int) -> dict:
    """The viewer's data for ``(name, run folder)`` pairs; runs without a dump are listed empty."""
    manifest = {"runs": [{"name": name, "steps": write_run(run, name, out, max_problems)} for name, run in runs]}
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "data" / "manifest.js").write_text(f"CBPO_SITE.manifest({json.dumps(manifest)});\n")
    return manifest
