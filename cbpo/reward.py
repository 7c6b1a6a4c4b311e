"""Outcome rewards R(tau) in [0, 1] (Sec. 4.3, Eq. 12): math by symbolic equivalence of the
extracted answer, search by normalised token F1 (or the benchmark's own metric). The same
extraction and scorers as evaluation, so training and Table 1 agree on what "correct" means:
the answer comes from the model's own text only (never from a ``<result>`` observation), and an
``<answer>`` block the token cap cut before ``</answer>`` scores 0 (``eval.verifiers.extract``)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from cbpo.trajectory import Trajectory
from eval.verifiers.extract import extract_answer
from eval.verifiers.scoring import Scorer, make_scorer

DOMAIN_METRIC = {"math": "math", "search": "f1"}


class Rewarder:
    """Scores response texts against their rows; keeps one verifier pool for the whole run."""

    def __init__(self, workers: int = 2, timeout: float = 5.0):
        self.workers, self.timeout = workers, timeout
        self._scorers: dict[str, Scorer] = {}

    def _metric(self, row: Mapping[str, Any]) -> str:
        metric = row.get("metric") or DOMAIN_METRIC.get(row.get("domain", ""))
        if metric is None:
            raise ValueError(f"row {row.get('id')!r}: no metric and unknown domain {row.get('domain')!r}")
        return metric

    def __call__(self, texts: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        preds = [extract_answer(t) for t in texts]
        scores = [0.0] * len(texts)
        by_metric: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_metric.setdefault(self._metric(row), []).append(i)
        for metric, idx in by_metric.items():
            if metric not in self._scorers:
                self._scorers[metric] = make_scorer(metric, workers=self.workers, timeout=self.timeout)
            for i, s in zip(idx, self._scorers[metric]([rows[i] for i in idx], [preds[i] for i in idx])):
                scores[i] = float(s)
        return scores

    def close(self) -> None:
        for scorer in self._scorers.values():
            scorer.close()
        self._scorers.clear()


def reward_rollouts(tokenizer, rewarder, trajs: Sequence[Trajectory], rows: Sequence[Mapping[str, Any]]) -> None:
    """Outcome rewards (Eq. 12) of finished rollouts, from their decoded responses."""
    if trajs:
        texts = tokenizer.batch_decode([t.response_ids for t in trajs], skip_special_tokens=False)
        for t, r in zip(trajs, rewarder(texts, rows)):
            t.reward = r
