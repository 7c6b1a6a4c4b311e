"""Pass@k, domain macro averages and bootstrap intervals (paper Sec. 5.1, Table 1, Fig. 4).

Pass@1 is the mean score over samples and problems (for F1 and judge scores, the mean partial
credit). Pass@k for k > 1 counts a sample correct when its score reaches ``threshold`` (1.0 for
binary math rewards) and uses the unbiased estimator of Chen et al. (2021), averaged over
problems: pass@k = 1 − C(n − c, k) / C(n, k) for n samples of which c are correct.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased probability that at least one of k samples drawn without replacement from n,
    c of them correct, is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i), stable for large n.
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(scores: Sequence[Sequence[float]], k: int, threshold: float = 1.0) -> float:
    """Mean pass@k over problems; ``scores[p]`` holds problem p's sample scores."""
    if not scores:
        raise ValueError("no problems to score")
    values = []
    for p, sample_scores in enumerate(scores):
        n = len(sample_scores)
        if n < k:
            raise ValueError(f"problem {p} has {n} samples, fewer than k={k}")
        values.append(pass_at_k(n, sum(s >= threshold for s in sample_scores), k))
    return float(np.mean(values))


def pass_at_1(scores: Sequence[Sequence[float]]) -> float:
    """Mean over problems of each problem's mean sample score."""
    return float(np.mean(per_problem_means(scores)))


def per_problem_means(scores: Sequence[Sequence[float]]) -> np.ndarray:
    if not scores or any(len(s) == 0 for s in scores):
        raise ValueError("every problem needs at least one sample score")
    return np.array([np.mean(s) for s in scores], dtype=np.float64)


def macro_average(column_scores: Mapping[str, float], column_domains: Mapping[str, str]) -> dict[str, float]:
    """Unweighted mean of the benchmark columns of each domain (Table 1's Avg. columns)."""
    by_domain: dict[str, list[float]] = {}
    for column, score in column_scores.items():
        if column not in column_domains:
            raise KeyError(f"column {column!r} has no domain")
        by_domain.setdefault(column_domains[column], []).append(float(score))
    return {domain: float(np.mean(values)) for domain, values in by_domain.items()}


def bootstrap_ci(
    values: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean.

    ``values`` is per-problem (shape [problems]) or per-seed-and-problem (shape [seeds,
    problems]); in the latter case seeds and problems are resampled independently, so the
    interval covers both training-seed and test-set variation."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim == 1:
        data = data[None, :]
    if data.ndim != 2 or data.size == 0:
        raise ValueError(f"expected a non-empty [problems] or [seeds, problems] array, got shape {data.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    n_seeds, n_problems = data.shape
    means = np.empty(n_boot)
    for b in range(n_boot):
        seeds = rng.integers(0, n_seeds, n_seeds) if n_seeds > 1 else np.zeros(1, dtype=int)
        problems = rng.integers(0, n_problems, n_problems)
        means[b] = data[np.ix_(seeds, problems)].mean()
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)
