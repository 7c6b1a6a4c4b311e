"""The retrieval server under load, and what an index costs per 100k passages.

Load: starts ``python -m cbpo.retriever serve`` on an index (loopback, a free port, through
``cbpo.retriever.lease``) and sends ``--queries`` single-query requests (topk 10, with scores) from ``--clients`` concurrent
clients, each bounded by ``--timeout`` seconds; prints throughput, p50/p99 latency, errors and
the server's resident memory before and after, and as its last line
``retriever qps=X p99_ms=Y errors=N rss_mb=Z``. Queries are ARPO's cached web queries and the
two-hop questions' entity names, cycled.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_retriever.py                 # the small corpus, bm25
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_retriever.py --scale 100000  # + a 100k-passage build

``--scale N`` first builds a corpus of N passages of about 100 words each (wiki-18's passage
length: three pages of the small corpus joined, drawn with a fixed seed), indexes it in a child
process (``python -m cbpo.retriever index``, peak RSS from its rusage) and serves that index
instead; it prints the build time, the index's bytes and the build's peak memory, scaled to
100k passages and to wiki-18's 21M.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from cbpo.prepare import small_corpus
from cbpo.retriever.index import build_index
from cbpo.retriever.lease import health, lease_server

WIKI18 = 21_015_324  # passages in Search-R1's wiki-18.jsonl


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def queries(n: int, passages: list[dict]) -> list[str]:
    from cbpo.data import shared_data_dir
    from cbpo.tools import ARPO_SEED

    cache = shared_data_dir() / ARPO_SEED
    pool = list(json.loads(cache.read_text())) if cache.is_file() else []
    pool += [p["title"] for p in passages if p["title"]][:1000]
    return [pool[i % len(pool)] for i in range(n)]


def scaled_corpus(path: Path, n: int, pages: list[dict]) -> None:
    rng = random.Random(0)
    texts = [p["text"] for p in pages]
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({"id": f"s{i}", "title": f"Passage {i}",
                                  "text": " ".join(rng.choice(texts) for _ in range(3))}) + "\n")


def build(corpus: Path, folder: Path, kind: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cbpo.retriever", "index", str(corpus), str(folder), "--kind", kind],
                   check=True, stdout=subprocess.DEVNULL)
    meta = json.loads((folder / "meta.json").read_text())
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    meta.update(wall=time.perf_counter() - started, peak_mb=max(peak, before) / 1024)
    return meta


def load(folder: Path, texts: list[str], clients: int, timeout: float) -> dict:
    lease = lease_server(folder, idle=1.0)  # a server of its own: the index is new
    try:
        url = lease.url
        pid = health(url)["pid"]
        idle_rss = rss_mb(pid)
        sessions = [requests.Session() for _ in range(clients)]

        def one(i: int) -> float | None:
            started = time.perf_counter()
            try:
                answer = sessions[i % clients].post(f"{url}/retrieve", timeout=timeout,
                                                    json={"queries": [texts[i]], "topk": 10, "return_scores": True})
                ok = answer.status_code == 200 and len(answer.json()["result"]) == 1
            except requests.RequestException:
                ok = False
            return time.perf_counter() - started if ok else None

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            latencies = list(pool.map(one, range(len(texts))))
        wall = time.perf_counter() - started
        done = sorted(t for t in latencies if t is not None)
        return {"wall": wall, "qps": len(done) / wall, "errors": len(latencies) - len(done),
                "p50_ms": 1000 * statistics.median(done), "p99_ms": 1000 * done[int(0.99 * (len(done) - 1))],
                "idle_rss_mb": idle_rss, "rss_mb": rss_mb(pid)}
    finally:
        lease.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--kind", choices=("bm25", "dense"), default="bm25")
    parser.add_argument("--scale", type=int, default=0, help="also build and serve an index of this many ~100-word passages")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pages = list(small_corpus(0, None))
        corpus = tmp / "small.jsonl"
        corpus.write_text("".join(json.dumps(p) + "\n" for p in pages))
        if args.scale:
            corpus = tmp / f"scaled{args.scale}.jsonl"
            scaled_corpus(corpus, args.scale, pages)
            meta = build(corpus, tmp / "index", args.kind)
            per = 100_000 / meta["size"]
            print(f"index {args.kind}: {meta['size']} passages ({corpus.stat().st_size / 2**20:.0f} MiB of JSONL) in "
                  f"{meta['wall']:.1f} s, {meta['bytes'] / 2**20:.0f} MiB on disk, build peak RSS {meta['peak_mb']:.0f} MiB")
            print(f"per 100k passages: {meta['wall'] * per:.1f} s, {meta['bytes'] * per / 2**20:.0f} MiB on disk; "
                  f"x{WIKI18 / 100_000:.0f} for wiki-18's 21M: {meta['wall'] * per * WIKI18 / 100_000 / 3600:.1f} h, "
                  f"{meta['bytes'] * per * WIKI18 / 100_000 / 2**30:.1f} GiB (linear extrapolation)")
        else:
            meta = build_index(corpus, tmp / "index", args.kind, name="small")
        print(f"serving {meta['size']} passages ({args.kind}); {args.queries} queries from {args.clients} clients; "
              f"load average {os.getloadavg()[0]:.2f}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
        result = load(tmp / "index", queries(args.queries, pages), args.clients, args.timeout)
        print(f"wall {result['wall']:.1f} s, {result['qps']:.0f} queries/s, p50 {result['p50_ms']:.1f} ms, "
              f"p99 {result['p99_ms']:.1f} ms, errors {result['errors']}, server RSS {result['idle_rss_mb']:.0f} MiB "
              f"idle -> {result['rss_mb']:.0f} MiB after")
        print(f"retriever qps={result['qps']:.0f} p99_ms={result['p99_ms']:.0f} errors={result['errors']} "
              f"rss_mb={result['rss_mb']:.0f}")


if __name__ == "__main__":
    main()
