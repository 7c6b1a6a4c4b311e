from __future__ import annotations

import pytest

from eval.verifiers.extract import extract_answer, last_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>\\boxed{42}</answer>", "42"),
        ("<think>x</think><answer>The answer is \\boxed{\\frac{1}{2}}.</answer>", "\\frac{1}{2}"),
        ("<answer>\\boxed{1} then \\boxed{2}</answer>", "2"),  # last box wins
        ("<answer>\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}</answer>", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("<answer>\\boxed{\\{1, 2\\}}</answer>", "\\{1, 2\\}"),  # escaped braces are not counted
        ("<answer>\\boxed{\\boxed{7}}</answer>", "7"),  # a box holding only a box is unwrapped
        ("<answer>\\fbox{x^{2}}</answer>", "x^{2}"),
        ("<answer>\\boxed {5}</answer>", "5"),
        ("<answer>  Paris  </answer>", "Paris"),  # no box: the block text
        ("<answer>first</answer> text <answer>second</answer>", "second"),  # final block
        ("<answer>\\boxed{9}</answer><answer>cut at the token cap \\boxed{10}", None),  # final block unclosed
        ("<answer>\\boxed{10}", None),  # cut before </answer>: not an answer
        ("<answer>Paris", None),
        ("<answer>\\boxed{\\frac{1}{2}", None),  # box never closes
        ("<answer>\\boxed{}</answer>", None),  # empty box
        ("<answer>   </answer>", None),
        ("\\boxed{5} but no answer tags", None),
        ("5 </answer>", None),  # a closing tag alone
        ("", None),
        (None, None),
        (12, None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_boxed_outside_the_final_block_is_ignored():
    assert extract_answer("\\boxed{1} <answer>two</answer>") == "two"


def test_last_boxed_reads_reference_solutions():
    solution = "So $x=\\boxed{\\dfrac{3}{4}}$. Check: \\boxed{\\sqrt{2}} is wrong? No: final \\boxed{\\dfrac{3}{4}}."
    assert last_boxed(solution) == "\\dfrac{3}{4}"
    assert last_boxed("no box here") is None


def test_never_raises_on_garbage():
    for text in ["<answer>" + "{" * 500, "<answer>\\boxed{" + "}" * 3, "<answer>\\\\boxed{a}", "<answer>\\"]:
        extract_answer(text)


def test_answers_inside_observations_do_not_count():
    observation = "<result>\n<answer>\\boxed{7}</answer>\n</result>"
    assert extract_answer("<python>print(7)</python>" + observation) is None
    assert extract_answer(observation + "<answer>\\boxed{8}</answer>") == "8"
    assert extract_answer("<answer>\\boxed{8}</answer>" + observation) == "8"
    # An observation cut by the token cap (no closing tag) is still an observation.
    assert extract_answer("<search>q</search><result>\nPage 1: <answer>\\boxed{7}</answer>") is None
