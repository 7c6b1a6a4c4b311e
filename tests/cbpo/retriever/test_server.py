"""The server as users run it (``python -m cbpo.retriever serve``, real uvicorn): Search-R1's
API, bm25s's ranking, and bad input answered without bringing it down."""
import json
import socket
import subprocess
import sys
import time

import bm25s
import numpy as np
import pytest
import requests

from cbpo.retriever.corpus import load_corpus
from cbpo.tools.search import SearchTool


@pytest.fixture(scope="module")
def server(bm25_index, tmp_path_factory):
    ready = tmp_path_factory.mktemp("serving") / "ready.json"
    process = subprocess.Popen([sys.executable, "-m", "cbpo.retriever", "serve", str(bm25_index), "--port", "0",
                                "--ready-file", str(ready), "--max-body-bytes", "1000000"])
    deadline = time.monotonic() + 60
    while not ready.is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    yield json.loads(ready.read_text())["url"]
    process.terminate()
    process.wait(10)


def retrieve(url, payload=None, data=None):
    return requests.post(f"{url}/retrieve", json=payload, data=data, timeout=30)


def test_top_10_is_bm25s_own_ranking(server, corpus_file):
    passages = load_corpus(corpus_file)
    model = bm25s.BM25()
    model.index(bm25s.tokenize([f"{p['title']}\n{p['text']}" for p in passages], stopwords="en", show_progress=False),
                show_progress=False)
    checked = 0
    for query in (f"w{i:03d} w{3 * i + 1:03d} w{7 * i + 2:03d}" for i in range(40)):
        docs, scores = model.retrieve(bm25s.tokenize([query], stopwords="en", show_progress=False), k=10,
                                      show_progress=False)
        if not np.all(np.diff(scores[0]) < 0):
            continue  # ties: the order would be a tie-break, not bm25s's ranking
        checked += 1
        answer = retrieve(server, {"queries": [query], "topk": 10, "return_scores": True}).json()
        (served,) = answer["result"]
        assert [h["document"]["id"] for h in served] == [passages[i]["id"] for i in docs[0]]
        np.testing.assert_allclose([h["score"] for h in served], scores[0], rtol=1e-6)
    assert checked >= 10


def test_the_suite_http_backend_reads_it_as_the_in_process_bm25(server, corpus_file):
    served = SearchTool("http", k=5, url=f"{server}/retrieve")
    local = SearchTool("bm25", k=5, corpus=corpus_file)
    assert served.backend.cache_id.startswith("http:bm25:") and served.backend.index["size"] == 300
    for query in ("w001 w017", "Title 12"):
        assert served(query) == local(query)
        assert [r["id"] for r in served.search(query)] == [r["id"] for r in local.search(query)]


def test_health_names_the_index(server, bm25_index):
    meta = json.loads((bm25_index / "meta.json").read_text())
    answer = requests.get(f"{server}/health", timeout=10).json()
    assert answer["status"] == "ok" and answer["corpus_sha"] == meta["corpus_sha"] and answer["size"] == 300


BAD = [
    ("malformed JSON", dict(data=b'{"queries": ['), 400, "not valid JSON"),
    ("not UTF-8", dict(data=b'{"queries": ["\xff\xfe"]}'), 400, "not UTF-8"),
    ("not an object", dict(payload=["w001"]), 422, "JSON object"),
    ("no queries", dict(payload={"topk": 3}), 422, "'queries' must be a list"),
    ("queries not strings", dict(payload={"queries": [1, 2]}), 422, "'queries' must be a list"),
    ("topk 0", dict(payload={"queries": ["w001"], "topk": 0}), 422, "'topk' must be an integer >= 1"),
    ("topk a string", dict(payload={"queries": ["w001"], "topk": "5"}), 422, "'topk'"),
    ("a 100 kB query", dict(payload={"queries": ["w001 " * 20_000]}), 422, "at most 4096"),
    ("too many queries", dict(payload={"queries": ["w001"] * 1025}), 422, "at most 1024"),
    ("a body over the limit", dict(data=b"x" * 1_200_000), 413, "at most 1000000"),
    ("return_scores not a bool", dict(payload={"queries": ["w001"], "return_scores": "yes"}), 422, "return_scores"),
]


@pytest.mark.parametrize("name, request_, status, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_4xx_with_a_message_and_the_server_still_answers(server, name, request_, status, message):
    answer = retrieve(server, request_.get("payload"), request_.get("data"))
    assert answer.status_code == status and message in answer.json()["error"]
    assert retrieve(server, {"queries": ["w001"], "topk": 1}).json()["result"][0]


def test_clamped_and_empty_answers(server):
    answer = retrieve(server, {"queries": ["w001 w002", "", "   "], "topk": 10**6}).json()
    assert answer["topk"] == 100  # clamped to --max-topk
    assert len(answer["result"][0]) == 100 and answer["result"][1:] == [[], []]
    assert "score" not in answer["result"][0][0] and answer["result"][0][0]["contents"].startswith('"Title')
    # Search-R1's default topk (3) when none is given; 1,000 queries in one request
    assert len(retrieve(server, {"queries": ["w001"]}).json()["result"][0]) == 3
    many = retrieve(server, {"queries": [f"w{i % 20:03d}" for i in range(1000)], "topk": 2}).json()["result"]
    assert len(many) == 1000 and all(len(row) == 2 for row in many)


def test_a_client_that_leaves_mid_request_does_not_stop_the_server(server):
    host, port = server.removeprefix("http://").split(":")
    body = json.dumps({"queries": ["w001"] * 500, "topk": 50}).encode()
    head = (f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    for sent in (head + body[:100], head + body):  # mid-body, and before reading the answer
        with socket.create_connection((host, int(port))) as client:
            client.sendall(sent)
    answers = [retrieve(server, {"queries": ["w001"], "topk": 1}) for _ in range(3)]
    assert all(a.status_code == 200 for a in answers)


def test_health_counts_rejected_requests(server):
    # on its own: under pytest-xdist's default distribution the BAD cases may run on another worker's server
    rejected = lambda: requests.get(f"{server}/health", timeout=10).json()["served"]["rejected"]  # noqa: E731
    before = rejected()
    for _, request_, status, _ in BAD:
        assert retrieve(server, request_.get("payload"), request_.get("data")).status_code == status
    assert rejected() == before + len(BAD)
