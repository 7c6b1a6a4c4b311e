from __future__ import annotations

import itertools

import numpy as np
import pytest

from eval.verifiers.metrics import bootstrap_ci, macro_average, mean_pass_at_k, pass_at_1, pass_at_k


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_mean_pass_at_k_thresholds_partial_scores():
    scores = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5]]
    assert mean_pass_at_k(scores, 1) == pytest.approx((1 / 3 + 0) / 2)
    assert mean_pass_at_k(scores, 1, threshold=0.5) == pytest.approx((1 / 3 + 1) / 2)
    assert mean_pass_at_k(scores, 3) == pytest.approx(0.5)
    assert pass_at_1(scores) == pytest.approx((1 / 3 + 0.5) / 2)
    with pytest.raises(ValueError, match="fewer than k"):
        mean_pass_at_k(scores, 5)


def test_macro_average_is_unweighted_over_columns():
    # Table 1, Qwen3-1.7B SFT row: math avg 60.3 = mean of its five columns.
    cols = {"AIME24": 16.7, "AIME25": 23.3, "MATH500": 82.8, "GSM8K": 91.0, "MATH": 87.6, "HotpotQA": 48.0}
    domains = {column: "math" for column in cols} | {"HotpotQA": "search"}
    avg = macro_average(cols, domains)
    assert avg["math"] == pytest.approx(60.28)
    assert avg["search"] == 48.0
    with pytest.raises(KeyError, match="no domain"):
        macro_average({"X": 1.0}, {})


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    rng = np.random.default_rng(1)
    values = rng.random(200) < 0.3
    low, high = bootstrap_ci(values, seed=3)
    assert low < values.mean() < high
    assert 0.15 < low and high < 0.45
    assert bootstrap_ci(values, seed=3) == (low, high)
    assert bootstrap_ci(np.ones(50)) == (1.0, 1.0)


def test_bootstrap_over_seeds_is_wider_when_seeds_disagree():
    problems = np.random.default_rng(0).random(100)
    agreeing = np.stack([problems, problems, problems])
    disagreeing = np.stack([problems * 0.5, problems, np.minimum(problems * 1.5, 1)])
    w_agree = np.subtract(*bootstrap_ci(agreeing)[::-1])
    w_disagree = np.subtract(*bootstrap_ci(disagreeing)[::-1])
    assert w_disagree > w_agree
