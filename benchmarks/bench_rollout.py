"""Rollout-phase cost of CBPO vs GRPO at equal rollout slots (16 per problem): generated model
tokens (a branch's copied prefix excluded), tool calls and wall time for the same problems,
each method's collect driving the agent loop as the trainer does (one running batch; a
problem's branches join it once its own parents are done). Each repeat runs GRPO then CBPO
from the same seed; the medians over repeats and their ratios are printed, with the load
average, since wall time on a shared machine is noisy.

``--engine vllm`` samples with vLLM (its CPU build without a GPU) and also prints the prompt
tokens each method prefilled and how many of them vLLM computed rather than served from its
prefix cache (a branch's prefix is its parent's, already cached); the cache is emptied before
every run, so no run reuses another's blocks. vLLM is seeded once, at start: its repeats draw
different samples.

    OMP_NUM_THREADS=2 .venv-engines/bin/python benchmarks/bench_rollout.py --engine vllm \
        --checkpoint runs/tiny/tiny/forks/seed0/sft/final --tasks arith_fork search_fork

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_rollout.py \
        --checkpoint runs/tiny/tiny/forks/seed0/sft/final --tasks arith_fork search_fork
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_rollout.py --checkpoint models/smollm2-135m

``--tasks`` should be those the checkpoint was trained on (the demo's: the fork tasks); half the
problems come from the first task's test split, half from the last's.

Without --checkpoint a fresh (untrained) tiny model is prepared in a temporary folder; its
entropy profile is flat, so numbers from a trained checkpoint are the meaningful ones.
"""
from __future__ import annotations

import argparse
import os
import statistics
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
from cbpo.tasks import environment_tools
from cbpo.tools import ToolsConfig
from cbpo.backends.local.rl import prefill_counts


def measure(method, prompts, engine, tokenizer, tools, agent_cfg):
    def sample(trajs, follow_up=None):
        return run_agent(engine, tokenizer, trajs, tools, agent_cfg, follow_up)

    before = prefill_counts(engine)
    t0 = time.perf_counter()
    with torch.no_grad():
        groups = method.collect(prompts, sample)
    wall = time.perf_counter() - t0
    after = prefill_counts(engine)
    flat = [t for g in groups for t in g]
    prefill = {}
    if after:
        prefill["prefill"] = after["prefill_tokens"] - before["prefill_tokens"]
        prefill["prefill_computed"] = prefill["prefill"] - (after["prefill_cached_tokens"] - before["prefill_cached_tokens"])
    return {
        "rollouts": len(flat),
        "tokens": sum(t.generated_tokens for t in flat),
        "tool_calls": sum(t.tool_calls - t.copied_tool_calls for t in flat),
        "branches": sum(t.kind == "branch" for t in flat),
        **prefill,
        "seconds": wall,
    }


def build_engine(name: str, checkpoint: Path, model, tokenizer):
    if name == "hf":
        return HFEngine(model, tokenizer, top_k_entropy=10, temperature=1.0)
    from cbpo.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(str(checkpoint), tokenizer, top_k_entropy=10, temperature=1.0, seed=0,
                      llm_kwargs={"dtype": str(model.dtype).removeprefix("torch.")})


def start_run(engine, rep: int) -> None:
    """The same starting point for every method: HF's seed, or vLLM's empty prefix cache."""
    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()
    else:
        engine.generator.manual_seed(rep)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--data-dir", type=Path, default=Path("data"))
    ap.add_argument("--tasks", nargs="+", default=["arith", "twohop"])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="rollout engine (vllm: also prefill tokens)")
    # One thread on a loaded machine: two threads there wait on each other (2-20x slower).
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from cbpo.tasks import generate_task

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir
        if not all((data_dir / "tasks" / task / "test.jsonl").is_file() for task in args.tasks):
            data_dir = Path(tmp)
            for task in args.tasks:
                generate_task(task, data_dir, 0, 200, 50)
        rows = load_split({"tasks": args.tasks}, data_dir, "test")
        ckpt = args.checkpoint
        if ckpt is None:
            texts = [x for r in load_split({"tasks": args.tasks}, data_dir, "train") for x in (r["question"], r["trace"])]
            ckpt = prepare_model("tiny", Path(tmp) / "tiny", corpus_texts=texts)
        model, tokenizer = load_model(ckpt)
        model.eval()
        tools = environment_tools(["python", "search"], ToolsConfig(python_timeout=5.0, search_k=3), seed=0)
        agent_cfg = AgentConfig(max_tool_calls=3, max_new_tokens=64, max_total_tokens=256, max_obs_tokens=96)
        half = args.problems // 2
        picked = rows[:half] + rows[-(args.problems - half):]  # both domains
        prompts = [build_prompt(tokenizer, r["question"]) for r in picked]
        methods = {
            "grpo": get_method("grpo")(budget=16),
            "cbpo": get_method("cbpo")(vocab_size=len(tokenizer), budget=16, n0=6, w=4, d_min=8),
        }
        runs = {name: [] for name in methods}
        load = os.getloadavg()[0]
        # One engine, as in training: its one-off set-up (the stop-string table) stays out of the timings.
        engine = build_engine(args.engine, ckpt, model, tokenizer)
        # Untimed: the first batch pays for allocator and kernel warm-up, which went to GRPO's first repeat.
        measure(methods["grpo"], prompts[:1], engine, tokenizer, tools, agent_cfg)
        for rep in range(args.repeats):
            for name, method in methods.items():
                start_run(engine, rep)
                runs[name].append(measure(method, prompts, engine, tokenizer, tools, agent_cfg))
                r = runs[name][-1]
                print(f"repeat {rep} {name}: generated tokens {r['tokens']}, wall {r['seconds']:.2f} s", flush=True)
    print(f"checkpoint: {args.checkpoint or 'fresh tiny model'}; engine {args.engine}; tasks {' '.join(args.tasks)}; "
          f"{args.problems} problems x 16 slots, median of {args.repeats} repeats; {torch.get_num_threads()} threads; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, t in med.items():
        prefill = f", prompt tokens {t['prefill']:.0f} (computed, not cached: {t['prefill_computed']:.0f})" if "prefill" in t else ""
        print(f"{name}: rollouts {t['rollouts']:.0f}, branches {t['branches']:.0f}, generated tokens {t['tokens']:.0f}, "
              f"tool calls {t['tool_calls']:.0f}{prefill}, wall {t['seconds']:.2f} s, {t['tokens'] / t['seconds']:.0f} tok/s")
    g, c = med["grpo"], med["cbpo"]
    ratios = [cr["seconds"] / gr["seconds"] for gr, cr in zip(runs["grpo"], runs["cbpo"])]
    prefill = f", prefill computed {c['prefill_computed'] / g['prefill_computed']:.3f}" if "prefill" in g else ""
    print(f"CBPO / GRPO: generated tokens {c['tokens'] / g['tokens']:.3f}{prefill}, wall time {c['seconds'] / g['seconds']:.3f} "
          f"(per repeat: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
