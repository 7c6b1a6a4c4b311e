from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import pytest

from eval.verifiers.verify import MathVerifier, Verdict, math_equal, normalise_math_text, score_math

EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{70}", "70"),
    ("2125", "2,125"),
    ("\\dfrac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("q-p+2p", "p + q"),
]
DIFFERENT = [
    ("0.49", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{3} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("71", "70"),
    ("p - q", "p + q"),
]


@pytest.mark.parametrize("pred, gold", EQUIVALENT)
def test_equivalent_answers(pred, gold):
    assert math_equal(pred, gold)


@pytest.mark.parametrize("pred, gold", DIFFERENT)
def test_different_answers(pred, gold):
    assert not math_equal(pred, gold)


def test_pool_agrees_with_in_process(math_verifier):
    preds = [p for p, _ in EQUIVALENT + DIFFERENT] + [None]
    golds = [g for _, g in EQUIVALENT + DIFFERENT] + ["1"]
    expected = [1.0] * len(EQUIVALENT) + [0.0] * len(DIFFERENT) + [0.0]
    assert math_verifier.score(preds, golds) == expected


def test_gold_aliases_take_the_max(math_verifier):
    assert math_verifier.score(["4", "5"], [["3", "4"], ["3", "4"]]) == [1.0, 0.0]
    assert math_equal("4", ["3", "4"])


def test_unparseable_text_falls_back_to_normalised_strings(math_verifier):
    verdicts = math_verifier.check(["\\text{Evelyn}", "Evelyn", "Bob"], ["\\text{Evelyn}", "evelyn.", "Evelyn"])
    assert [v.correct for v in verdicts] == [True, True, False]
    assert normalise_math_text("$\\left( 1,\\, 2 \\right)$.") == "(1,2)"


def test_a_stuck_worker_is_killed_and_the_rest_still_scored():
    # Freeze the pool's workers (as if stuck in C code that no alarm interrupts): the first
    # item passes its deadline, scores 0, the pool is killed and a fresh one scores the rest.
    # SIGTERM reaches a stopped process only once it is continued, hence the SIGCONT timer.
    before = set(multiprocessing.active_children())
    with MathVerifier(workers=2, timeout=1.0, deadline=1.0) as v:
        assert v.check(["1"], ["1"])[0].correct  # workers are up
        workers = [p for p in multiprocessing.active_children() if p not in before]
        assert len(workers) == 2
        for p in workers:
            os.kill(p.pid, signal.SIGSTOP)
        resume = threading.Timer(3.0, lambda: [os.kill(p.pid, signal.SIGCONT) for p in workers])
        resume.start()
        try:
            verdicts = v.check(["1", "2", "3"], ["1", "2", "4"])
        finally:
            resume.join()
    assert verdicts[0] == Verdict(False, "timeout")
    assert [x.correct for x in verdicts[1:]] == [True, False]


def test_math_equal_from_a_thread_does_not_crash():
    result = []
    thread = threading.Thread(target=lambda: result.append(math_equal("\\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert result == [True]


def test_bad_arguments():
    with pytest.raises(ValueError, match="predictions"):
        score_math(["1"], [])
    with pytest.raises(ValueError, match="workers"):
        MathVerifier(workers=0)
