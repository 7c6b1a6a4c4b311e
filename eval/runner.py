"""Evaluate one checkpoint on one benchmark: per-sample JSONL + summary JSON, resumable.

``generate(batch, n)`` is the caller's: it holds the model, the prompt, the tools (and their
shared search cache) and the decoding settings, so every method is evaluated under the same
protocol by passing the same callable. It returns, for each row of ``batch``, ``n`` dicts with
at least ``trajectory`` (the full response text), ``tokens`` and ``tool_calls``; any other keys
(e.g. ``prompt``, ``finish``) are stored as they are.

Crash safety: ``samples.jsonl`` is appended, flushed and fsynced after every batch, so a kill
loses at most the batch in flight; a rerun reads it, drops a torn last line, and generates only
the (id, sample) pairs that are missing. ``summary.json`` is written atomically at the very end
and removed when a run starts with work to do, so its presence means "finished".

Identity: the caller's ``identity`` (the checkpoint's fingerprint and every setting that changes
samples) is kept in ``identity.json``; samples made under another identity are dropped, never
resumed, so a summary always describes the checkpoint and settings it names. One process
writes an output folder at a time (:class:`cbpo.runs.WriterLock`).
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tqdm import tqdm

from cbpo.data import read_appended, write_atomically
from cbpo.runs import WriterLock
from eval.verifiers.extract import extract_answer
from eval.verifiers.metrics import bootstrap_ci, mean_pass_at_k, pass_at_1, per_problem_means
from eval.verifiers.scoring import make_scorer

Generate = Callable[[list[dict], int], list[list[dict]]]
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
IDENTITY = "identity.json"
PASS_AT = (1, 3, 5)


def run_benchmark(
    rows: Sequence[Mapping[str, Any]],
    generate: Generate,
    out_dir: str | Path,
    n_samples: int = 1,
    batch_size: int = 8,
    scorer: Callable[[Sequence[Mapping[str, Any]], Sequence[str | None]], list[float]] | None = None,
    benchmark: str | None = None,
    threshold: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    identity: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Generate ``n_samples`` responses per row (only those not already in
    ``out_dir/samples.jsonl``), score them, and write and return the summary.

    ``scorer(rows, extracted_answers) -> scores`` defaults to the rows' metric
    (``eval.verifiers.scoring.make_scorer``; a judge benchmark needs ``eval.benchmarks.scorer_for``).
    ``threshold`` is the score at which a sample counts as correct for pass@k. ``identity``
    (JSON) names what the samples come from: samples of another identity are regenerated."""
    if not rows:
        raise ValueError("no rows to evaluate")
    if n_samples < 1 or batch_size < 1:
        raise ValueError(f"n_samples and batch_size must be >= 1, got {n_samples}, {batch_size}")
    by_id = {str(row["id"]): row for row in rows}
    if len(by_id) != len(rows):
        raise ValueError("row ids are not unique")
    out = Path(out_dir)
    samples_path = out / SAMPLES
    with WriterLock(out):
        if identity is not None:
            _forget_other_identity(out, identity)
        done = _read_samples(samples_path, by_id)
        todo = [(row, [s for s in range(n_samples) if (str(row["id"]), s) not in done]) for row in rows]
        todo = [(row, missing) for row, missing in todo if missing]

        # A plain callable scorer on rows without a "metric" key is recorded as "custom".
        metric = getattr(scorer, "metric", None) or _single_metric(rows, scorer) or "custom"
        if todo:
            owns_scorer = scorer is None
            scorer = scorer or make_scorer(metric)
            try:
                scored_by = getattr(scorer, "used", metric)
                earlier = {r.get("scored_by") for r in done.values()} - {scored_by}
                if earlier:
                    raise ValueError(f"{samples_path} was scored with {sorted(map(str, earlier))}, this run scores "
                                     f"with {scored_by!r}: use a fresh out_dir or delete the file")
                (out / SUMMARY).unlink(missing_ok=True)
                _generate_missing(todo, generate, scorer, scored_by, samples_path, batch_size, done, progress)
            finally:
                if owns_scorer:
                    scorer.close()

        summary = _summarise(rows, done, n_samples, metric, benchmark, threshold, seed)
        write_atomically(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
        return summary


def _forget_other_identity(out: Path, identity: Mapping[str, Any]) -> None:
    """Drop samples and summary made under another identity, then record this one (in that
    order: a kill in between leaves a mismatch, never old samples under the new identity)."""
    identity = json.loads(json.dumps(identity, sort_keys=True))
    path = out / IDENTITY
    old = json.loads(path.read_text()) if path.is_file() else {}
    if old == identity:
        return
    if old or (out / SAMPLES).exists():
        changed = sorted(k for k in {*identity, *old} if old.get(k) != identity.get(k))
        print(f"{out}: samples were made with {({k: old.get(k) for k in changed})}, this run uses "
              f"{({k: identity.get(k) for k in changed})}: regenerating them")
    (out / SAMPLES).unlink(missing_ok=True)
    (out / SUMMARY).unlink(missing_ok=True)
    write_atomically(path, json.dumps(identity, indent=1, sort_keys=True) + "\n")


def _single_metric(rows, scorer) -> str | None:
    metrics = {row.get("metric") for row in rows}
    if len(metrics) != 1 or (scorer is None and None in metrics):
        raise ValueError(f"rows have metrics {sorted(map(str, metrics))}: need exactly one, or pass a scorer")
    return metrics.pop()


def _generate_missing(
    todo, generate, scorer, scored_by: str, samples_path: Path, batch_size: int, done: dict, progress: bool
) -> None:
    # Rows resumed mid-way need fewer samples than fresh ones; batch rows needing the same count.
    groups: dict[int, list[tuple[Mapping, list[int]]]] = defaultdict(list)
    for row, missing in todo:
        groups[len(missing)].append((row, missing))
    bar = tqdm(total=sum(len(m) for _, m in todo), desc="eval", unit="sample", disable=not progress)
    with samples_path.open("a", encoding="utf-8") as handle:
        for n, group in groups.items():
            for start in range(0, len(group), batch_size):
                chunk = group[start:start + batch_size]
                batch = [dict(row) for row, _ in chunk]
                t0 = time.perf_counter()
                outputs = generate(batch, n)
                seconds = time.perf_counter() - t0
                if len(outputs) != len(batch) or any(len(o) != n for o in outputs):
                    got = [len(o) for o in outputs]
                    raise ValueError(f"generate returned {got} samples for {len(batch)} rows × {n}")
                records = _score_batch(chunk, outputs, scorer, scored_by)
                for record in records:  # each sample's share of its batch: the summary adds them up
                    record["seconds"] = seconds / len(records)
                handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                handle.flush()
                os.fsync(handle.fileno())
                for record in records:
                    done[(record["id"], record["sample"])] = record
                bar.update(len(records))
                bar.set_postfix(score=f"{sum(r['score'] for r in records) / len(records):.3f}")
    bar.close()


_RESERVED = {"id", "sample", "question", "gold", "answer", "score", "scored_by", "seconds"}


def _score_batch(chunk, outputs: list[list[dict]], scorer, scored_by: str) -> list[dict]:
    flat_rows, records = [], []
    for (row, missing), samples in zip(chunk, outputs):
        for index, sample in zip(missing, samples):
            if "trajectory" not in sample:
                raise ValueError(f"generate's sample for id {row['id']!r} has no 'trajectory'")
            clash = _RESERVED & set(sample)
            if clash:
                raise ValueError(f"generate's sample for id {row['id']!r} sets runner-owned keys {sorted(clash)}")
            records.append({
                "id": str(row["id"]),
                "sample": index,
                "question": row["question"],
                "gold": row["answer"],
                **sample,
                "answer": extract_answer(sample["trajectory"]),
                "tokens": int(sample.get("tokens", 0)),
                "tool_calls": int(sample.get("tool_calls", 0)),
            })
            flat_rows.append(row)
    scores = scorer(flat_rows, [r["answer"] for r in records])
    for record, score in zip(records, scores):
        record["score"] = float(score)
        record["scored_by"] = scored_by
    return records


def _read_samples(path: Path, by_id: Mapping[str, Any]) -> dict[tuple[str, int], dict]:
    """Finished samples by (id, sample index). A write torn by a kill is cut off the file
    (``cbpo.data.read_appended``; those samples are generated again); other damage is an error,
    not something to skip silently."""
    done: dict[tuple[str, int], dict] = {}
    if not path.exists():
        return done
    records, size = read_appended(path, "sample record")
    if size < path.stat().st_size:
        with path.open("r+b") as handle:
            handle.truncate(size)
    for lineno, record in records:
        if not isinstance(record, dict) or not {"id", "sample", "score"} <= set(record):
            raise ValueError(f"{path}:{lineno}: sample record lacks id/sample/score")
        if record["id"] not in by_id:
            raise ValueError(f"{path}:{lineno}: id {record['id']!r} is not in this benchmark (wrong out_dir?)")
        done.setdefault((record["id"], int(record["sample"])), record)
    return done


def _summarise(rows, done, n_samples: int, metric, benchmark, threshold: float, seed: int) -> dict[str, Any]:
    records = [done[(str(row["id"]), s)] for row in rows for s in range(n_samples)]
    scores = [[done[(str(row["id"]), s)]["score"] for s in range(n_samples)] for row in rows]
    scored_by = sorted({str(r.get("scored_by")) for r in records})
    metric_used = scored_by[0] if len(scored_by) == 1 else "+".join(scored_by)
    low, high = bootstrap_ci(per_problem_means(scores), seed=seed)
    return {
        "benchmark": benchmark,
        "problems": len(rows),
        "n": n_samples,
        "metric": metric,
        "metric_used": metric_used,
        # The table marks a column scored by a fallback (e.g. F1 instead of the LLM judge).
        "fallback_used": metric_used != metric,
        "pass@1": pass_at_1(scores),
        "pass@k": {str(k): mean_pass_at_k(scores, k, threshold) for k in PASS_AT if k <= n_samples},
        "pass@k_threshold": threshold,
        "ci95_pass@1": [low, high],
        "answered": sum(r["answer"] is not None for r in records) / len(records),
        "mean_tool_calls": sum(r["tool_calls"] for r in records) / len(records),
        "mean_tokens": sum(r["tokens"] for r in records) / len(records),
        # generation time of these samples, however many runs made them (not loading or scoring)
        "generation_seconds": sum(r.get("seconds", 0.0) for r in records),
    }
