"""The retrieval server: Search-R1's API over an index folder, on FastAPI + uvicorn.

``POST /retrieve`` ``{"queries": [str, …], "topk": k, "return_scores": bool}`` answers
``{"result": [[{"document": {"id", "contents"}, "score"}, …], …]}`` (bare documents without
``return_scores``), ``contents`` being the quoted title on the first line and the text after,
as wiki-18's passages are. ``GET /health`` names the index (name, kind, size, corpus hash).

Bad input is answered, never fatal: a body that is not UTF-8 or not JSON gets 400, one larger
than ``Limits.max_body_bytes`` 413, a request of the wrong shape 422, each with
``{"error": message}``. ``topk`` above ``Limits.max_topk`` is clamped to it (the answer's
``topk`` says what was used); a blank query answers an empty list. Concurrent requests are
searched together (``Batcher``): one search thread, so an index is never searched from two
threads at once and a 2-core machine is not oversubscribed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cbpo.retriever.index import Index


def _limit(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Limits:
    """What one request may ask; each bound is the server's ``--max-*`` option."""

    max_body_bytes: int = _limit(4 << 20, "larger bodies get 413 (1,000 queries of 4 kB each fit)")
    max_queries: int = _limit(1024, "more queries in one request get 422")
    max_query_chars: int = _limit(4096, "a longer query gets 422: it is already not a search query")
    max_topk: int = _limit(100, "a larger topk is clamped to this (the answer's topk says so)")
    default_topk: int = _limit(3, "topk when a request gives none (Search-R1's retrieval_topk)")
    batch_wait_ms: float = _limit(2.0, "how long the first request of a batch waits for others")
    max_batch: int = _limit(256, "queries searched together")


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, limits: Limits) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body, or a ``RequestError``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"the body is not UTF-8 ({error})") from None
    try:
        request = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"the body is not valid JSON ({error})") from None
    if not isinstance(request, dict):
        raise RequestError(422, "the body must be a JSON object with 'queries' (and 'topk', 'return_scores')")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError(422, "'queries' must be a list of strings")
    if len(queries) > limits.max_queries:
        raise RequestError(422, f"{len(queries)} queries in one request; at most {limits.max_queries}")
    for i, query in enumerate(queries):
        if len(query) > limits.max_query_chars:
            raise RequestError(422, f"query {i} has {len(query)} characters; at most {limits.max_query_chars}")
    topk = request.get("topk")
    topk = limits.default_topk if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise RequestError(422, f"'topk' must be an integer >= 1, got {topk!r}")
    return_scores = request.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, min(topk, limits.max_topk), return_scores


class Batcher:
    """Searches the queries of concurrent requests in one call on one worker thread: the first
    request waits up to ``batch_wait_ms`` for others, up to ``max_batch`` queries."""

    def __init__(self, search: Callable[[list[str], int], list[list[dict]]], limits: Limits):
        self._search, self._limits = search, limits
        self._queue: asyncio.Queue = asyncio.Queue()

    async def submit(self, queries: list[str], k: int) -> list[list[dict]]:
        wanted = [q for q in queries if q.strip()]
        if not wanted:
            return [[] for _ in queries]
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((wanted, k, future))
        found = iter(await future)
        return [next(found) if q.strip() else [] for q in queries]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            size, deadline = len(batch[0][0]), loop.time() + self._limits.batch_wait_ms / 1000
            while size < self._limits.max_batch and (left := deadline - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
                size += len(batch[-1][0])
            queries = [q for wanted, _, _ in batch for q in wanted]
            try:
                hits = await asyncio.to_thread(self._search, queries, max(k for _, k, _ in batch))
            except Exception as error:  # the requests get a 500 each; the server goes on
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            start = 0
            for wanted, k, future in batch:
                if not future.done():  # a client that left has a cancelled future
                    future.set_result([h[:k] for h in hits[start : start + len(wanted)]])
                start += len(wanted)


def _document(hit: dict) -> dict:
    return {"id": hit["id"], "contents": f'"{hit["title"]}"\n{hit["text"]}'}


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body has {declared} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body has more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(index: Index, limits: Limits = Limits(), on_startup: Callable[[], Any] | None = None,
               background: Callable[[], Any] | None = None):
    """The ASGI app over ``index``. ``on_startup`` runs once the app starts (the lease's ready
    file); ``background()``, a coroutine, runs beside it (the lease watcher)."""
    counts = {"requests": 0, "queries": 0, "rejected": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher = Batcher(index.search, limits)
        app.state.batcher = batcher
        tasks = [asyncio.create_task(batcher.run())]
        if background is not None:
            tasks.append(asyncio.create_task(background()))
        if on_startup is not None:
            on_startup()
        yield
        for task in tasks:
            task.cancel()
        print(f"stopped after {counts['requests']} requests ({counts['queries']} queries), "
              f"{counts['rejected']} rejected", flush=True)

    app = FastAPI(title="cbpo retriever", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(RequestError)
    async def rejected(request, error: RequestError):
        counts["rejected"] += 1
        return JSONResponse({"error": str(error)}, status_code=error.status)

    @app.post("/retrieve")
    async def retrieve(request: Request):
        body = await _read_body(request, limits.max_body_bytes)
        queries, topk, return_scores = parse_request(body, limits)
        counts["requests"] += 1
        counts["queries"] += len(queries)
        hits = await request.app.state.batcher.submit(queries, topk)
        if return_scores:
            result = [[{"document": _document(h), "score": h["score"]} for h in row] for row in hits]
        else:
            result = [[_document(h) for h in row] for row in hits]
        return {"result": result, "topk": topk}

    @app.get("/health")
    async def health():
        meta = index.meta
        return {"status": "ok", **{k: meta.get(k) for k in ("name", "kind", "size", "corpus_sha", "model", "faiss")},
                "pid": os.getpid(), "served": dict(counts), "limits": asdict(limits)}

    return app


def serve(folder: str | Path, host: str = "127.0.0.1", port: int = 8000, limits: Limits = Limits(),
          on_ready: Callable[[str], Any] | None = None, watcher: Callable[[Any], Any] | None = None,
          log_level: str = "warning") -> None:
    """Serve the index in ``folder`` until stopped. ``port`` 0 takes a free one; ``on_ready(url)``
    runs once requests are accepted. ``watcher(server)`` returns a coroutine run beside the
    server that may set ``server.should_exit`` (the lease's idle exit)."""
    import uvicorn

    index = Index(folder)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from here on, before uvicorn accepts them
    url = f"http://{host}:{sock.getsockname()[1]}"
    holder: dict[str, Any] = {}
    app = create_app(index, limits, on_startup=(lambda: on_ready(url)) if on_ready else None,
                     background=(lambda: watcher(holder["server"])) if watcher else None)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False,
                                           timeout_graceful_shutdown=5))
    holder["server"] = server
    print(f"serving {index.meta['kind']} index {index.meta['name']!r} ({len(index)} passages, "
          f"corpus {index.meta['corpus_sha']}) at {url}", flush=True)
    server.run(sockets=[sock])
