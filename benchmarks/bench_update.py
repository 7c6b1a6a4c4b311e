"""The local trainer's update on one CBPO batch with and without ``rl.shared_prefix`` (#37
item 3): the batch is collected once (HF engine, the tiny preset's agent settings and
temperature, no system prompt as in the tiny preset), scored and credited by CBPO; then each
repeat times ``policy_update`` from the same weights with the tiny preset's update settings (4
mini-batches of AdamW at lr 2e-4, micro-batches of 64), unshared then shared. Printed: the
median step times, the token slots each layout computes (padded rows vs prefix trees), the
largest difference between the two updated weights, the load average and the CPU's ISA, and as
the last line ``shared/unshared update=R``.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_update.py \\
        --checkpoint runs/tiny/tiny/forks/seed0/sft/final --tasks arith_fork search_fork
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_rollout import add_setup_args, collect, cpu_isa, setup
from cbpo.backends.local.rl import policy_update, update_plan
from cbpo.chat import resolve_system_prompt
from cbpo.logprobs import prefix_tree_tensors, rollout_tensors
from cbpo.objective import ObjectiveConfig
from cbpo.reward import Rewarder, reward_rollouts
from cbpo.rollout.engine import HFEngine
from cbpo.stages import RLConfig


def slots(trajs, credits, cfg: RLConfig, layout) -> int:
    """Token positions the update's forward passes compute, micro-batch by micro-batch as
    ``policy_update`` cuts them (``update_plan``), in ``layout``."""
    _, plans = update_plan(trajs, credits, cfg)
    return sum(layout([trajs[i] for i in idx], [credits[i] for i in idx], 0)["input_ids"].numel()
               for plan in plans for idx in plan)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_setup_args(ap)
    ap.add_argument("--system-prompt", default="none", help="as the tiny preset: none; or default, or the text")
    ap.set_defaults(tasks=["arith_fork", "search_fork"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        picked, ckpt, model, tokenizer, tools, agent_cfg, methods = setup(args, Path(tmp))
        engine = HFEngine(model, tokenizer, top_k_entropy=10, temperature=0.7, generator=0)
        groups = collect(methods["cbpo"], picked, engine, tokenizer, tools, agent_cfg, resolve_system_prompt(args.system_prompt))
    rewarder = Rewarder()
    try:
        reward_rollouts(tokenizer, rewarder, [t for g in groups for t in g], [r for r, g in zip(picked, groups) for _ in g])
    finally:
        rewarder.close()
    trajs = [t for g in groups for t in g]
    credits = [c for g in methods["cbpo"].credit(groups) for c in g]
    base = {"ppo_mini_batches": 4, "micro_batch_size": 64, "lr": 2e-4, "temperature": 0.7}
    cfgs = {shared: RLConfig(**base, shared_prefix=shared) for shared in (False, True)}
    load = os.getloadavg()[0]
    times: dict[bool, list[float]] = {False: [], True: []}
    weights = {}
    model.train()
    for rep in range(args.repeats):
        for shared, cfg in cfgs.items():
            net = copy.deepcopy(model)
            opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
            t0 = time.perf_counter()
            policy_update(net, None, opt, trajs, credits, cfg, ObjectiveConfig(beta=0.0), tokenizer.pad_token_id)
            times[shared].append(time.perf_counter() - t0)
            weights[shared] = torch.cat([p.detach().flatten() for p in net.parameters()])
            print(f"repeat {rep} {'shared' if shared else 'unshared'}: {times[shared][-1]:.3f} s", flush=True)
    unshared, shared = statistics.median(times[False]), statistics.median(times[True])
    kinds = {k: sum(t.kind == k for t in trajs) for k in ("parent", "branch", "fill")}
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
    print(f"checkpoint: {args.checkpoint or 'fresh tiny model'}; tasks {' '.join(args.tasks)}; {args.problems} problems, "
          f"{len(trajs)} rollouts ({', '.join(f'{v} {k}' for k, v in kinds.items())}), mean prompt "
          f"{np.mean([len(t.prompt_ids) for t in trajs]):.0f} tokens, mean sequence {np.mean(lengths):.0f}; "
          f"median of {args.repeats} repeats; {torch.get_num_threads()} threads; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; CPU {cpu_isa()}")
    print(f"token slots per update: unshared {slots(trajs, credits, cfgs[False], rollout_tensors)}, "
          f"shared {slots(trajs, credits, cfgs[True], prefix_tree_tensors)}")
    print(f"largest weight difference after the update: {(weights[True] - weights[False]).abs().max():.2e}")
    print(f"update: unshared {unshared:.3f} s, shared {shared:.3f} s")
    print(f"shared/unshared update={shared / unshared:.3f}")


if __name__ == "__main__":
    main()
