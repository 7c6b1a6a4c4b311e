"""Rollout-phase cost of CBPO vs GRPO at equal rollout slots (16 per problem): generated model
tokens (a branch's copied prefix excluded), tool calls and wall time for the same problems.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_rollout.py --checkpoint runs/tiny/mix/sft/final

Without --checkpoint a fresh (untrained) tiny model is prepared in a temporary folder; its
entropy profile is flat, so numbers from a trained checkpoint are the meaningful ones.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from cbpo.chat import build_prompt
from cbpo.data import load_split
from cbpo.models import load_model, prepare_model
from cbpo.registry import get_method
from cbpo.rollout.agent import AgentConfig, run_agent
from cbpo.rollout.engine import HFEngine
from cbpo.tools import build_tools


def measure(method, prompts, engine, tokenizer, tools, agent_cfg):
    t0 = time.perf_counter()
    with torch.no_grad():
        groups = method.collect(prompts, lambda trajs: run_agent(engine, tokenizer, trajs, tools, agent_cfg))
    wall = time.perf_counter() - t0
    flat = [t for g in groups for t in g]
    return {
        "rollouts": len(flat),
        "tokens": sum(t.generated_tokens for t in flat),
        "tool_calls": sum(t.tool_calls - t.copied_tool_calls for t in flat),
        "branches": sum(t.kind == "branch" for t in flat),
        "seconds": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--data-dir", type=Path, default=Path("data"))
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from cbpo.data import generate_task

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir
        if not (data_dir / "tasks" / "arith" / "test.jsonl").is_file():
            data_dir = Path(tmp)
            for task in ("arith", "twohop"):
                generate_task(task, data_dir, 0, 200, 50)
        rows = load_split({"tasks": ["arith", "twohop"]}, data_dir, "test")
        ckpt = args.checkpoint
        if ckpt is None:
            texts = [x for r in load_split({"tasks": ["arith", "twohop"]}, data_dir, "train") for x in (r["question"], r["trace"])]
            ckpt = prepare_model("tiny", Path(tmp) / "tiny", corpus_texts=texts)
        model, tokenizer = load_model(ckpt)
        model.eval()
        tools = build_tools(["python", "search"], {"search_k": 3, "python_timeout": 5.0})
        agent_cfg = AgentConfig(max_tool_calls=3, max_new_tokens=64, max_total_tokens=256, max_obs_tokens=96)
        half = args.problems // 2
        picked = rows[:half] + rows[-(args.problems - half):]  # both domains
        prompts = [build_prompt(tokenizer, r["question"]) for r in picked]
        methods = {
            "grpo": get_method("grpo")(budget=16),
            "cbpo": get_method("cbpo")(vocab_size=len(tokenizer), budget=16, n0=6, w=4, d_min=8),
        }
        totals = {name: {"tokens": 0, "seconds": 0.0, "tool_calls": 0, "branches": 0, "rollouts": 0} for name in methods}
        for rep in range(args.repeats):
            for name, method in methods.items():
                engine = HFEngine(model, tokenizer, top_k_entropy=10, temperature=1.0, generator=rep)
                for k, v in measure(method, prompts, engine, tokenizer, tools, agent_cfg).items():
                    totals[name][k] += v
    print(f"checkpoint: {args.checkpoint or 'fresh tiny model'}; {args.problems} problems x 16 slots x {args.repeats} repeats")
    for name, t in totals.items():
        print(f"{name}: rollouts {t['rollouts']}, branches {t['branches']}, generated tokens {t['tokens']}, "
              f"tool calls {t['tool_calls']}, wall {t['seconds']:.2f} s, {t['tokens'] / t['seconds']:.0f} tok/s")
    g, c = totals["grpo"], totals["cbpo"]
    print(f"CBPO / GRPO: generated tokens {c['tokens'] / g['tokens']:.3f}, wall time {c['seconds'] / g['seconds']:.3f}")


if __name__ == "__main__":
    main()
