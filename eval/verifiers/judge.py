"""LLM-as-judge scoring for WebWalker (paper Sec. 5.1: "WebWalker (LLM-as-judge Pass@1)").

Any OpenAI-compatible server works (a vLLM ``serve`` endpoint, a hosted API): one
``POST {base_url}/chat/completions`` per unseen (question, gold, prediction), the reply read as
yes/no (or a score in [0, 1]). Verdicts are cached in SQLite, keyed by the judge model, the
prompt template and the three texts, so reruns and other methods' identical answers cost
nothing and every method is judged by the same verdicts.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Mapping, Sequence

import requests

from eval.verifiers.gold import Gold, gold_aliases

ENV_URL = "CBPO_JUDGE_URL"
ENV_MODEL = "CBPO_JUDGE_MODEL"
ENV_API_KEY = "CBPO_JUDGE_API_KEY"
ENV_CACHE = "CBPO_JUDGE_CACHE"


class JudgeUnavailable(RuntimeError):
    """No judge endpoint is configured."""


class JudgeError(RuntimeError):
    """The endpoint failed or replied with something that is not a verdict."""


def default_cache_path() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "cbpo" / "judge_cache.sqlite")


def judge_from_config(config: Mapping[str, Any], cache_path: str | Path | None = None) -> LLMJudge:
    """A judge from a benchmark's ``judge:`` block; ``$CBPO_JUDGE_URL`` and
    ``$CBPO_JUDGE_MODEL`` override it. Raises JudgeUnavailable without an endpoint."""
    base_url = os.environ.get(ENV_URL) or config.get("base_url")
    if not base_url:
        raise JudgeUnavailable(
            "this benchmark is scored by an LLM judge but no endpoint is set: export "
            f"{ENV_URL}=http://HOST:PORT/v1 (any OpenAI-compatible server, e.g. `vllm serve`), or "
            "choose a fallback metric explicitly (fallback='f1'); the table then marks the column"
        )
    for key in ("model", "prompt"):
        if not config.get(key) and not (key == "model" and os.environ.get(ENV_MODEL)):
            raise ValueError(f"judge config has no {key!r}")
    return LLMJudge(
        base_url=base_url,
        model=os.environ.get(ENV_MODEL) or config["model"],
        prompt=config["prompt"],
        cache_path=cache_path or default_cache_path(),
        api_key=os.environ.get(ENV_API_KEY),
        temperature=float(config.get("temperature", 0.0)),
        max_tokens=config.get("max_tokens"),
    )


class LLMJudge:
    def __init__(
        self,
        base_url: str,
        model: str,
        prompt: str,
        cache_path: str | Path,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        request_timeout: float = 120.0,
        concurrency: int = 4,
        retries: int = 2,
    ):
        for field in ("question", "gold", "prediction"):
            if "{" + field + "}" not in prompt:
                raise ValueError(f"judge prompt template lacks the {{{field}}} placeholder")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.prompt = prompt
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.request_timeout = request_timeout
        self.concurrency = concurrency
        self.retries = retries
        cache_path = Path(cache_path)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(cache_path)
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, score REAL, reply TEXT)")
        self._db.commit()

    def settings(self) -> dict[str, Any]:
        """What a verdict depends on, for the summary: the prompt by its sha256."""
        return {"model": self.model, "url": self.url, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "prompt_sha256": hashlib.sha256(self.prompt.encode()).hexdigest()}

    def close(self) -> None:
        self._db.close()

    def score(
        self, questions: Sequence[str], golds: Sequence[Gold], predictions: Sequence[str | None]
    ) -> list[float]:
        """One score in [0, 1] per item; None predictions score 0 without a request."""
        if not len(questions) == len(golds) == len(predictions):
            raise ValueError("questions, golds and predictions differ in length")
        scores = [0.0] * len(questions)
        wanted: dict[str, tuple[str, list[int]]] = {}  # key -> (prompt text, item indices)
        for i, (question, gold, pred) in enumerate(zip(questions, golds, predictions)):
            if pred is None:
                continue
            gold_text = " / ".join(gold_aliases(gold))
            key = self._key(question, gold_text, pred)
            content = self.prompt.format(question=question, gold=gold_text, prediction=pred)
            wanted.setdefault(key, (content, []))[1].append(i)
        cached = self._lookup(list(wanted))
        misses = [key for key in wanted if key not in cached]
        # Verdicts are stored as they arrive, so a failure later in the batch loses none of them.
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                futures = {pool.submit(self._ask, wanted[key][0]): key for key in misses}
                for future in as_completed(futures):
                    key, reply = futures[future], future.result()
                    cached[key] = parse_verdict(reply)
                    self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", (key, cached[key], reply))
        finally:
            self._db.commit()
        for key, (_, indices) in wanted.items():
            for i in indices:
                scores[i] = cached[key]
        return scores

    def _key(self, question: str, gold: str, prediction: str) -> str:
        blob = json.dumps([self.model, self.prompt, question, gold, prediction], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _lookup(self, keys: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for start in range(0, len(keys), 500):  # SQLite caps bound parameters per statement
            chunk = keys[start:start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self._db.execute(f"SELECT key, score FROM verdicts WHERE key IN ({marks})", chunk))
        return found

    def _ask(self, content: str) -> str:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        for attempt in range(self.retries + 1):
            try:
                response = requests.post(self.url, json=body, headers=headers, timeout=self.request_timeout)
            except requests.RequestException as err:
                problem = f"{type(err).__name__}: {err}"
            else:
                if response.status_code < 500:
                    break
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if attempt == self.retries:
                raise JudgeError(f"judge endpoint {self.url} failed: {problem}")
            time.sleep(2**attempt)
        if response.status_code != 200:
            raise JudgeError(f"judge endpoint {self.url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge endpoint {self.url}: not a chat completion: {response.text[:200]}") from None


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_WORD = re.compile(r"[a-z]+")
_VERDICT_WORDS = {"yes": 1.0, "correct": 1.0, "true": 1.0, "no": 0.0, "incorrect": 0.0, "false": 0.0}
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)")


def parse_verdict(reply: str) -> float:
    """A judge reply as a score: the first yes/no-like word (yes, correct, true → 1; no,
    incorrect, false → 0; "not" before it flips it), else the first number in [0, 1]; a reasoning model's
    ``<think>…</think>`` is skipped. Anything else raises JudgeError."""
    text = _THINK.sub(" ", reply).lower()
    words = _WORD.findall(text)
    for i, word in enumerate(words):
        if word in _VERDICT_WORDS:
            negated = i > 0 and words[i - 1] == "not"  # "not correct"
            return 1.0 - _VERDICT_WORDS[word] if negated else _VERDICT_WORDS[word]
    for number in _NUMBER.findall(text):
        if 0.0 <= float(number) <= 1.0:
            return float(number)
    raise JudgeError(f"judge reply has no yes/no or score in [0, 1]: {reply[:200]!r}")
