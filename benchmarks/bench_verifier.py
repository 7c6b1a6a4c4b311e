"""Math verifier throughput: answers/s of eval.verifiers.verify.MathVerifier on 2 worker processes.

Pairs: every MATH-500 gold answer against its ``\\boxed{}`` form (synthetic fractions when
../shared/data is absent). Each pair is a full parse(gold) + parse(pred) + verify, as in
evaluation. Each pass starts a fresh pool, warmed before timing.
Run: ``python benchmarks/bench_verifier.py [--workers 2] [--repeats 2]``.
"""
from __future__ import annotations

import argparse
import os
import time

from eval.benchmarks import load_benchmark, shared_data_dir
from eval.verifiers.verify import MathVerifier


def pairs() -> tuple[list[str], list[str], str]:
    if (shared_data_dir() / "benchmarks" / "math500" / "test.jsonl").is_file():
        golds = [row["answer"] for row in load_benchmark("math500")]
        source = "MATH-500 gold vs \\boxed{gold}"
    else:
        golds = [f"\\frac{{{i}}}{{{i + 7}}}" for i in range(1, 501)]
        source = "synthetic fractions (shared data absent)"
    return [f"\\boxed{{{g}}}" for g in golds], golds, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes, each on a fresh pool")
    args = parser.parse_args()
    preds, golds, source = pairs()
    rates, startups = [], []
    for _ in range(args.repeats):
        # A fresh pool per pass: sympy's own caches would flatter a second pass over the same
        # expressions, which an evaluation of new answers does not get.
        with MathVerifier(workers=args.workers, timeout=5.0) as verifier:
            t0 = time.perf_counter()
            verifier.check(["1"], ["1"])
            startups.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            verdicts = verifier.check(preds, golds)
            rates.append(len(preds) / (time.perf_counter() - t0))
    correct = sum(v.correct for v in verdicts)
    print(f"pairs: {len(preds)} ({source}); correct {correct}/{len(preds)}")
    print(f"pool start + warm-up: " + ", ".join(f"{x:.2f}" for x in startups) + " s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"throughput on {args.workers} workers: " + ", ".join(f"{x:.0f}" for x in rates) + " answers/s")

if __name__ == "__main__":
    main()
