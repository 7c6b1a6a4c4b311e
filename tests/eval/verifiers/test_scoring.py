from __future__ import annotations

import pytest

from eval.verifiers.scoring import make_scorer

ROWS = [{"question": "q", "answer": ["New York City", "NYC"]}, {"question": "q", "answer": "4"}]


def test_f1_and_em_scorers():
    assert make_scorer("f1")(ROWS[:1], ["new york"]) == [pytest.approx(0.8)]
    assert make_scorer("em")(ROWS[:1], ["nyc"]) == [1.0]
    assert make_scorer("em")(ROWS[:1], [None]) == [0.0]


def test_bad_metric_and_fallback():
    with pytest.raises(ValueError, match="unknown metric"):
        make_scorer("bleu")
    with pytest.raises(ValueError, match="fallback"):
        make_scorer("judge", {}, fallback="math")
