"""Normalised token F1 and exact match for the search benchmarks (paper Sec. 5.1: HotpotQA,
2WikiMultiHopQA, MuSiQue, Bamboogle are scored by normalised token F1).

Normalisation follows the SQuAD/HotpotQA evaluation scripts: lowercase, delete punctuation,
drop the articles a/an/the, collapse whitespace; F1 is over the bag of tokens, and a
yes/no/noanswer prediction only matches the same word (HotpotQA's rule). Three additions that
leave plain English answers unchanged: LaTeX text wrappers (``\\text{Paris}``, what a model
puts in a box) are unwrapped, Unicode punctuation is deleted along with ASCII punctuation, and
each CJK character is its own token (WebWalker's Chinese answers have no spaces, so whitespace
tokens would reduce F1 to exact match there).
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

from eval.verifiers.gold import Gold, gold_aliases

_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CJK = re.compile(r"([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff])")
_YES_NO = {"yes", "no", "noanswer"}


def normalize_answer(text: str) -> str:
    text = _LATEX_TEXT.sub(r"\1", text).lower()
    text = "".join(ch for ch in text if not _is_punctuation(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    return _CJK.sub(r" \1 ", normalize_answer(text)).split()


def exact_match(pred: str | None, gold: Gold) -> float:
    """1.0 when the normalised prediction equals a normalised gold alias."""
    if pred is None:
        return 0.0
    norm = normalize_answer(pred)
    return float(any(norm == normalize_answer(g) for g in gold_aliases(gold)))


def f1_score(pred: str | None, gold: Gold) -> float:
    """Token F1, max over gold aliases; 0.0 for no prediction."""
    if pred is None:
        return 0.0
    return max(_f1(pred, g) for g in gold_aliases(gold))


def _f1(pred: str, gold: str) -> float:
    norm_pred, norm_gold = normalize_answer(pred), normalize_answer(gold)
    if (norm_pred in _YES_NO or norm_gold in _YES_NO) and norm_pred != norm_gold:
        return 0.0
    pred_tokens, gold_tokens = tokens(pred), tokens(gold)
    if not pred_tokens or not gold_tokens:
        # Nothing left after normalisation (e.g. the answer "The"): only an equal one matches.
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _is_punctuation(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")

