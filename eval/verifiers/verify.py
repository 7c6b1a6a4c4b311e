"""Symbolic equivalence of math answers (paper Eq. 12: reward 1 iff the answer is symbolically
equivalent to the reference), via HuggingFace ``math_verify``.

``math_verify`` bounds its parse and verify steps with ``signal.alarm``, which works only in a
process's main thread; batches therefore run in a pool of worker *processes*, each item with a
deadline, and a worker stuck past it (in C code that no signal interrupts, or dead) is killed
with its pool; the item scores 0. ``math_equal`` runs one pair in the calling process.

Decision rule for one (prediction, gold) pair, both already-extracted answer strings:
1. Each side is handed to ``math_verify.parse``; bare LaTeX is wrapped as ``\\boxed{…}`` first
   (a bare ``\\frac{\\sqrt2}{2}`` parses to nothing), text that already has ``$``, ``\\(``,
   ``\\[`` or a ``\\boxed`` is parsed as it is.
2. Both sides parsed → ``math_verify.verify(gold, pred)``.
3. Fallback, when either side does not parse or verify says no: normalised string equality
   (drop ``$``, ``\\left``/``\\right``, LaTeX spacing commands and all whitespace, unwrap
   ``\\text{…}``-like wrappers, ``\\dfrac``/``\\tfrac`` → ``\\frac``, drop a trailing period,
   lowercase). It only ever turns a "no" into a "yes" for strings that are the same answer
   written the same way.
"""
from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import re
import threading
from dataclasses import dataclass
from typing import Sequence

from eval.verifiers.gold import Gold, gold_aliases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    method: str  # "math_verify" | "string" | "timeout" (worker killed at the deadline)


def math_equal(pred: str | None, gold: Gold, timeout: float = 5.0) -> bool:
    """True when ``pred`` is equivalent to ``gold`` (or to any of its aliases), in-process.

    From a thread other than the main one, ``math_verify``'s signal timeouts cannot be armed,
    so they are switched off there; use ``score_math`` for untrusted batches."""
    if pred is None:
        return False
    seconds = _alarm_seconds(timeout) if threading.current_thread() is threading.main_thread() else None
    return any(_check_pair(pred, g, seconds).correct for g in gold_aliases(gold))


def score_math(
    preds: Sequence[str | None], golds: Sequence[Gold], workers: int = 2, timeout: float = 5.0
) -> list[float]:
    """1.0/0.0 per (prediction, gold) pair, computed in ``workers`` processes with a deadline
    per item. ``None`` predictions (no extracted answer) score 0 without work."""
    with MathVerifier(workers=workers, timeout=timeout) as verifier:
        return verifier.score(preds, golds)


class MathVerifier:
    """A reusable pool of verifier processes (spawned once, ~1 s; reuse it across batches)."""

    def __init__(self, workers: int = 2, timeout: float = 5.0, deadline: float | None = None):
        """``timeout``: math_verify's own alarm, per parse and per verify call. ``deadline``:
        wall-clock seconds one item may take before its worker is killed (default
        3 × timeout + 2: two parses and a verify, plus slack for a busy machine)."""
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.workers = workers
        self.timeout = timeout
        self.deadline = 3 * _alarm_seconds(timeout) + 2.0 if deadline is None else deadline
        self._pool = None

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def score(self, preds: Sequence[str | None], golds: Sequence[Gold]) -> list[float]:
        """Max over gold aliases of 1.0/0.0, one per pair."""
        if len(preds) != len(golds):
            raise ValueError(f"{len(preds)} predictions but {len(golds)} golds")
        flat_pred, flat_gold, owner = [], [], []
        for i, (pred, gold) in enumerate(zip(preds, golds)):
            if pred is None:
                continue
            for alias in gold_aliases(gold):
                flat_pred.append(pred)
                flat_gold.append(alias)
                owner.append(i)
        scores = [0.0] * len(preds)
        for i, verdict in zip(owner, self.check(flat_pred, flat_gold)):
            if verdict.correct:
                scores[i] = 1.0
        return scores

    def check(self, preds: Sequence[str], golds: Sequence[str]) -> list[Verdict]:
        """One ``Verdict`` per (prediction, single gold) pair, in order."""
        if len(preds) != len(golds):
            raise ValueError(f"{len(preds)} predictions but {len(golds)} golds")
        verdicts: list[Verdict | None] = [None] * len(preds)
        pending = list(range(len(preds)))
        seconds = _alarm_seconds(self.timeout)
        while pending:
            pool = self._ensure_pool()
            jobs = [(k, pool.apply_async(_check_pair, (preds[k], golds[k], seconds))) for k in pending]
            pending = []
            for pos, (k, job) in enumerate(jobs):
                try:
                    verdicts[k] = job.get(timeout=self.deadline)
                except multiprocessing.TimeoutError:
                    log.warning("math verifier: item past its %.0f s deadline scored 0: pred=%.80r gold=%.80r",
                                self.deadline, preds[k], golds[k])
                    verdicts[k] = Verdict(False, "timeout")
                    rest = jobs[pos + 1:]
                    for k2, job2 in rest:
                        if job2.ready():
                            verdicts[k2] = job2.get()
                        else:
                            pending.append(k2)
                    self.close()  # the stuck worker cannot be interrupted: kill the pool
                    break
        return verdicts  # type: ignore[return-value]

    def _ensure_pool(self):
        if self._pool is None:
            # spawn, not fork: the caller may hold threads (tqdm, torch, CUDA) that fork breaks.
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(self.workers, initializer=_warm_up)
            try:
                self._pool.apply_async(_warm_up).get(timeout=_START_TIMEOUT)
            except multiprocessing.TimeoutError:
                self.close()
                raise RuntimeError(
                    f"math verifier workers did not start within {_START_TIMEOUT:.0f} s; a script "
                    "that scores math must guard its entry point with `if __name__ == '__main__':` "
                    "(workers are spawned and re-import the main module)"
                ) from None
        return self._pool


_START_TIMEOUT = 60.0


def _warm_up() -> None:
    # Import sympy and build the LaTeX parser now, not inside the first item's deadline.
    _check_pair("\\frac{1}{2}", "0.5", 5)


def _check_pair(pred: str, gold: str, seconds: int | None) -> Verdict:
    """Decision rule of the module docstring, for one pair and one gold string."""
    from math_verify import verify

    try:
        gold_parsed = _parse(gold, seconds)
        pred_parsed = _parse(pred, seconds)
        if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=seconds):
            return Verdict(True, "math_verify")
        parsed = bool(gold_parsed and pred_parsed)
    except Exception:  # math_verify on arbitrary model text: any failure means "cannot parse"
        parsed = False
    if normalise_math_text(pred) == normalise_math_text(gold):
        return Verdict(True, "string")
    return Verdict(False, "math_verify" if parsed else "string")


@functools.lru_cache(maxsize=8192)
def _parse(text: str, seconds: int | None) -> list:
    """math_verify's parse of ``text``, memoised: a gold answer recurs once per sample."""
    from math_verify import parse

    return parse(_wrap(text), parsing_timeout=seconds)


_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")  # not after a backslash: \$ is a dollar sign


def _wrap(text: str) -> str:
    return text if _DELIMITED.search(text) else "\\boxed{" + text + "}"


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\left|\\right|\\[,;:! ]|~|\$|\s+")


def normalise_math_text(text: str) -> str:
    """The fallback's canonical form of an answer string (see the module docstring)."""
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SPACING.sub("", text)
    return text.rstrip(".").lower()


def _alarm_seconds(timeout: float) -> int:
    # signal.alarm takes whole seconds.
    return max(1, math.ceil(timeout))
