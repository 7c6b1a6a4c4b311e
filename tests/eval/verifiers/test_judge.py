from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from eval.benchmarks import benchmark_config
from eval.verifiers.judge import JudgeError, JudgeUnavailable, LLMJudge, judge_from_config, parse_verdict


class FakeJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions that says yes iff the prediction line equals
    the reference line of the prompt (case-insensitive)."""

    requests: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        prompt = body["messages"][0]["content"]
        gold = re.search(r"Reference answer: (.*)", prompt).group(1).strip().lower()
        pred = re.search(r"Predicted answer: (.*)", prompt).group(1).strip().lower()
        if pred == "boom":
            self.send_response(500)
            self.end_headers()
            return
        reply = {"choices": [{"message": {"role": "assistant", "content": "Yes." if gold == pred else "no"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    FakeJudge.requests = []
    httpd = HTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def webwalker_judge():
    return benchmark_config("webwalker")["judge"]


def test_judge_path_and_cache(server, webwalker_judge, tmp_path, monkeypatch):
    monkeypatch.setenv("CBPO_JUDGE_URL", server)
    cache = tmp_path / "judge.sqlite"
    judge = judge_from_config(webwalker_judge, cache_path=cache)
    questions = ["Who?", "Who?", "Where?", "When?"]
    golds = ["肖亮", "肖亮", ["Paris", "City of Paris"], "1999"]
    preds = ["肖亮", "肖亮", "London", None]
    assert judge.score(questions, golds, preds) == [1.0, 1.0, 0.0, 0.0]
    # Two distinct (question, gold, prediction) triples: the duplicate and the None cost nothing.
    assert len(FakeJudge.requests) == 2
    first = FakeJudge.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["body"]["model"] == webwalker_judge["model"]
    assert first["body"]["temperature"] == 0.0
    judge.close()

    # A new judge on the same cache file: every verdict is served from the cache.
    again = judge_from_config(webwalker_judge, cache_path=cache)
    assert again.score(questions[:1], golds[:1], preds[:1]) == [1.0]
    assert len(FakeJudge.requests) == 2
    # A different prediction is a new key.
    assert again.score(["Who?"], ["肖亮"], ["xiao liang"]) == [0.0]
    assert len(FakeJudge.requests) == 3


def test_a_failing_request_keeps_the_verdicts_already_received(server, webwalker_judge, tmp_path):
    judge = LLMJudge(server, "m", webwalker_judge["prompt"], tmp_path / "c.sqlite", retries=0, concurrency=1)
    with pytest.raises(JudgeError, match="HTTP 500"):
        judge.score(["q", "q"], ["a", "a"], ["a", "boom"])
    seen = len(FakeJudge.requests)
    assert judge.score(["q"], ["a"], ["a"]) == [1.0]
    assert len(FakeJudge.requests) == seen


def test_without_endpoint_the_error_says_what_to_do(webwalker_judge, monkeypatch):
    monkeypatch.delenv("CBPO_JUDGE_URL", raising=False)
    with pytest.raises(JudgeUnavailable, match="CBPO_JUDGE_URL.*fallback"):
        judge_from_config(webwalker_judge)


def test_dead_endpoint_is_a_judge_error(tmp_path):
    judge = LLMJudge("http://127.0.0.1:9/v1", "m", "{question}{gold}{prediction}", tmp_path / "c.sqlite", retries=0)
    with pytest.raises(JudgeError, match="failed"):
        judge.score(["q"], ["g"], ["p"])


def test_prompt_must_have_the_placeholders(tmp_path):
    with pytest.raises(ValueError, match="prediction"):
        LLMJudge("http://x/v1", "m", "{question} {gold}", tmp_path / "c.sqlite")


@pytest.mark.parametrize(
    "reply, score",
    [("yes", 1.0), ("No.", 0.0), ("Correct", 1.0), ("INCORRECT", 0.0), ("The answer is not correct.", 0.0),
     ("<think>maybe yes</think>no", 0.0), ("score: 0.5", 0.5), ("1", 1.0)],
)
def test_parse_verdict(reply, score):
    assert parse_verdict(reply) == score


def test_unreadable_verdict_is_an_error():
    with pytest.raises(JudgeError, match="no yes/no"):
        parse_verdict("I am unsure, 7 out of 10")
