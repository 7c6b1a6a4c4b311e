"""One scorer per benchmark metric: rows + extracted answers → scores in [0, 1].

``metric`` is what the benchmark asks for; ``used`` is what was applied. They differ only when
the LLM judge has no endpoint and a fallback metric was chosen explicitly, and then
``fallback_used`` is True so the summary and the table can mark the column.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from eval.verifiers.judge import JudgeUnavailable, LLMJudge, judge_from_config
from eval.verifiers.qa_metrics import exact_match, f1_score
from eval.verifiers.verify import MathVerifier

log = logging.getLogger(__name__)

METRICS = ("math", "f1", "em", "judge")  # what a benchmark can ask for (eval/benchmarks/*.yaml)
FALLBACK_METRICS = ("f1", "em")


class Scorer:
    def __init__(
        self, metric: str, used: str, verifier: MathVerifier | None = None, judge: LLMJudge | None = None
    ):
        self.metric = metric
        self.used = used
        self._verifier = verifier
        self._judge = judge

    @property
    def judge(self) -> LLMJudge | None:
        return self._judge

    @property
    def fallback_used(self) -> bool:
        return self.used != self.metric

    def __call__(self, rows: Sequence[Mapping[str, Any]], predictions: Sequence[str | None]) -> list[float]:
        """Scores of extracted answers (None = no answer = 0) against ``row["answer"]``."""
        if len(rows) != len(predictions):
            raise ValueError(f"{len(rows)} rows but {len(predictions)} predictions")
        golds = [row["answer"] for row in rows]
        if self.used == "math":
            return self._verifier.score(predictions, golds)
        if self.used == "f1":
            return [f1_score(p, g) for p, g in zip(predictions, golds)]
        if self.used == "em":
            return [exact_match(p, g) for p, g in zip(predictions, golds)]
        return self._judge.score([row["question"] for row in rows], golds, predictions)

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.close()
        if self._judge is not None:
            self._judge.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_scorer(
    metric: str,
    judge_config: Mapping[str, Any] | None = None,
    fallback: str | None = None,
    workers: int = 2,
    timeout: float = 5.0,
) -> Scorer:
    """A scorer for ``metric``. ``judge`` needs ``judge_config`` (a benchmark's ``judge:``
    block) and an endpoint; without an endpoint it raises JudgeUnavailable unless ``fallback``
    (f1 or em) is given."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if fallback is not None and fallback not in FALLBACK_METRICS:
        raise ValueError(f"fallback metric must be one of {FALLBACK_METRICS}, got {fallback!r}")
    if metric == "math":
        return Scorer(metric, metric, verifier=MathVerifier(workers=workers, timeout=timeout))
    if metric in ("f1", "em"):
        return Scorer(metric, metric)
    if judge_config is None:
        raise ValueError("metric 'judge' needs the benchmark's judge config (eval.benchmarks.scorer_for(name) passes it)")
    try:
        return Scorer(metric, metric, judge=judge_from_config(judge_config))
    except JudgeUnavailable:
        if fallback is None:
            raise
        log.warning("no LLM judge endpoint: scoring with the %s fallback; the column is marked", fallback)
        return Scorer(metric, fallback)
