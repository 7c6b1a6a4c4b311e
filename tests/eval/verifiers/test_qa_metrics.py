from __future__ import annotations

import pytest

from eval.verifiers.qa_metrics import exact_match, f1_score, normalize_answer, tokens


def test_normalisation_is_squad_style():
    assert normalize_answer("The  Big, Apple!") == "big apple"
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("\\text{Paris}") == "paris"


def test_exact_match_takes_the_best_alias():
    assert exact_match("new york city", ["NYC", "New York City"]) == 1.0
    assert exact_match("New York", ["NYC", "New York City"]) == 0.0
    assert exact_match(None, "x") == 0.0


def test_token_f1_value():
    # pred tokens {barack, obama}, gold {obama}: P = 1/2, R = 1, F1 = 2/3.
    assert f1_score("Barack Obama", "Obama") == pytest.approx(2 / 3)
    assert f1_score("Obama", ["Barack Obama", "Obama"]) == 1.0
    assert f1_score("Paris", "London") == 0.0
    assert f1_score(None, "x") == 0.0


def test_yes_no_only_match_themselves():
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("yes it is", "yes") == 0.0
    assert f1_score("no", "yes") == 0.0


def test_cjk_characters_are_tokens():
    assert tokens("肖亮。") == ["肖", "亮"]
    assert 0 < f1_score("讲座主讲人是肖亮", "肖亮") < 1


def test_empty_after_normalisation():
    assert f1_score("the", "a") == 1.0
    assert f1_score("the", "Paris") == 0.0


def test_empty_alias_list_is_an_error():
    with pytest.raises(ValueError, match="no aliases"):
        f1_score("x", [])
