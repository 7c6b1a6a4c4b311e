"""Time CBPO's Stage 1 (allocation) + Stage 2 (credit) for 64 problems x 16 rollouts x 4,096
tokens, the issue's target being <= 50 ms on a 2-core machine.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_core.py
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from cbpo.branching import plan_branches
from cbpo.config import CBPOConfig
from cbpo.credit import ProblemRollouts, assign_credit

PROBLEMS, TOKENS, VOCAB = 64, 4096, 151_936


def make_batch(rng: np.random.Generator, cfg: CBPOConfig):
    # Entropy profiles with bursts, so the allocation has real choices to make.
    entropies = [
        [rng.gamma(0.5, 0.6, TOKENS) * (1 + 3 * (rng.random(TOKENS) < 0.05)) for _ in range(cfg.n0)]
        for _ in range(PROBLEMS)
    ]
    return entropies


def step(entropies, rng, cfg):
    problems = []
    for ents in entropies:
        plan = plan_branches(ents, VOCAB, cfg)
        m = cfg.n0 + len(plan.branches) + plan.fill
        kinds = ["parent"] * cfg.n0 + ["branch"] * len(plan.branches) + ["fill"] * plan.fill
        parent = [-1] * cfg.n0 + [i for i, _ in plan.branches] + [-1] * plan.fill
        at = [-1] * cfg.n0 + [b for _, b in plan.branches] + [-1] * plan.fill
        problems.append(ProblemRollouts(rng.integers(0, 2, m).astype(float), kinds, parent, at, [TOKENS] * m))
    return assign_credit(problems, cfg)


def main() -> None:
    cfg = CBPOConfig()
    rng = np.random.default_rng(0)
    entropies = make_batch(rng, cfg)
    step(entropies, rng, cfg)  # warm-up
    times, alloc_times = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        for ents in entropies:
            plan_branches(ents, VOCAB, cfg)
        alloc_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        credit = step(entropies, rng, cfg)
        times.append(time.perf_counter() - t0)
    n_branches = sum(len(n.members) - 1 for n in credit.nodes)
    print(f"batch: {PROBLEMS} problems x {cfg.budget} rollouts x {TOKENS} tokens; {len(credit.nodes)} nodes, {n_branches} branches")
    print(f"allocation alone:    median {1e3 * statistics.median(alloc_times):.1f} ms")
    print(f"allocation + credit: median {1e3 * statistics.median(times):.1f} ms, min {1e3 * min(times):.1f} ms (target <= 50 ms)")


if __name__ == "__main__":
    main()
