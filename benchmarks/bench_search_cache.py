"""Search cache on a repeated evaluation: hit rate and per-query latency, cached vs uncached.

An evaluation-like query stream: for each of ``--questions`` two-hop test questions, the two
searches of its trace, issued by ``--samples`` rollouts (Pass@k sampling repeats queries). The
stream runs once without a cache, then twice through one ``SearchCache`` (a second evaluation
job over the same questions).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_search_cache.py [--backend dense]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from cbpo.tasks import twohop
from cbpo.tools.search import SearchTool
from cbpo.tools.search_cache import SearchCache


def query_stream(seed: int, questions: int, samples: int) -> list[str]:
    rows = twohop.generate(seed, n_train=0, n_test=questions)["test"]
    queries = [q for row in rows for q in re.findall(r"<search>(.*?)</search>", row["trace"])]
    return [q for q in queries for _ in range(samples)]


def run_pass(tool: SearchTool, queries: list[str]) -> list[float]:
    seconds = []
    for query in queries:
        start = time.perf_counter()
        tool(query)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("bm25", "dense"), default="bm25")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--samples", type=int, default=4, help="rollouts per question")
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    if args.backend == "dense":
        import torch

        torch.set_num_threads(1)

    queries = query_stream(args.seed, args.questions, args.samples)
    with tempfile.TemporaryDirectory() as workdir:
        corpus = Path(workdir) / "twohop.jsonl"
        corpus.write_text("".join(json.dumps(p) + "\n" for p in twohop.corpus(args.seed)))
        tool = SearchTool(args.backend, k=args.k, corpus=corpus)
        uncached = run_pass(tool, queries)
        with SearchCache(Path(workdir) / "cache.db") as cache:
            cached_tool = SearchTool(tool.backend, k=args.k, cache=cache)
            first = run_pass(cached_tool, queries)
            first_counts = (cache.hits, cache.misses)
            second = run_pass(cached_tool, queries)
            second_hits = cache.hits - first_counts[0]

    def ms(values: list[float]) -> str:
        return f"mean {1e3 * statistics.mean(values):.3f} ms, median {1e3 * statistics.median(values):.3f} ms"

    print(f"backend={args.backend} k={args.k} corpus={len(twohop.corpus(args.seed))} passages "
          f"queries={len(queries)} ({len(set(queries))} distinct, {args.samples} samples x "
          f"{args.questions} questions x 2 hops)")
    hits, misses = first_counts
    print(f"pass 1 hit rate: {hits / len(queries):.3f}  (hits {hits}, misses {misses})")
    print(f"pass 2 hit rate: {second_hits / len(queries):.3f}")
    print(f"latency per query, no cache:           {ms(uncached)}")
    print(f"latency per query, pass 1 (miss+hit):  {ms(first)}")
    print(f"latency per query, pass 2 (cached):    {ms(second)}")


if __name__ == "__main__":
    main()
