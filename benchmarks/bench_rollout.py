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

``--admission both`` (vLLM only) runs every repeat under both of the agent loop's admissions on
the one engine (``VLLMEngine.admission``: ``stream``, rows join vLLM's batch as soon as they are
ready; ``rounds``, each round waits for its slowest row) and prints, per method and admission,
the engine steps and the mean unfinished rows per step besides the tokens and wall time; then
the excess of CBPO's wall over its tokens (wall ratio / token ratio) under each, and as the last
line ``excess stream=X rounds=Y; cbpo stream/rounds=Z``:

    OMP_NUM_THREADS=2 .venv-engines/bin/python benchmarks/bench_rollout.py --engine vllm --admission both \
        --checkpoint models/smollm2-135m

``--engine verl`` measures the verl path instead (run it in the engine environment): in a fresh
folder (``--workdir``) the DAG makes the smoke preset's SFT checkpoint on verl, then GRPO and CBPO
(its entropy gate off, so the smoke model branches) train for the preset's 2 steps on verl; each
step's metrics line gives its rollout time and the prompt tokens verl's vLLM server prefilled,
and of those the share its prefix cache served (a problem's requests reach one server,
``ServerEngine``). Smoke scale: 2 problems x 4 slots a step.

    OMP_NUM_THREADS=2 .venv-engines/bin/python benchmarks/bench_rollout.py --engine verl

``--tasks`` should be those the checkpoint was trained on (the demo's: the fork tasks); half the
problems come from the first task's test split, half from the last's.

Without --checkpoint a fresh (untrained) tiny model is prepared in a temporary folder; its
entropy profile is flat, so numbers from a trained checkpoint are the meaningful ones.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cbpo.chat import SYSTEM_PROMPT, build_prompt
from cbpo.data import load_split
from cbpo.models import load_model, prepare_model
from cbpo import registry
from cbpo.registry import get_method
from cbpo.backends.local.rl import rollout_counts
from cbpo.rollout.agent import AgentConfig, run_agent
from cbpo.rollout.engine import HFEngine
from cbpo.tasks import environment_tools
from cbpo.tools import ToolsConfig

ROOT = Path(__file__).resolve().parents[1]


def collect(method, problems, engine, tokenizer, tools, agent_cfg, system_prompt=SYSTEM_PROMPT):
    """One collection of ``problems`` (data rows) as the trainer's (``registry.collect``),
    unscored: the method's groups of rollouts."""
    def sample(trajs, follow_up=None):
        return run_agent(engine, tokenizer, trajs, tools, agent_cfg, follow_up)

    def encode(question):
        return build_prompt(tokenizer, question, system_prompt)

    with torch.no_grad():
        return registry.collect(method, [encode(r["question"]) for r in problems], sample,
                                registry.Problems(problems, encode, lambda groups, indices: None))


def measure(method, problems, engine, tokenizer, tools, agent_cfg):
    """:func:`collect`'s token, call and prefill counts and wall time."""
    before = rollout_counts(engine)
    t0 = time.perf_counter()
    groups = collect(method, problems, engine, tokenizer, tools, agent_cfg)
    wall = time.perf_counter() - t0
    after = rollout_counts(engine)
    flat = [t for g in groups for t in g]
    counts = {k: after[k] - before[k] for k in after}
    return {
        "rollouts": len(flat),
        "tokens": sum(t.generated_tokens for t in flat),
        "tool_calls": sum(t.tool_calls - t.copied_tool_calls for t in flat),
        "branches": sum(t.kind == "branch" for t in flat),
        **counts,
        "seconds": wall,
    }


def cpu_isa() -> str:
    """The widest vector ISA of this CPU that vLLM's CPU kernels use (AVX-512 or AVX2)."""
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), []) if Path("/proc/cpuinfo").exists() else []
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX-512 nor AVX2"


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


def add_setup_args(ap: argparse.ArgumentParser) -> None:
    """The arguments :func:`setup` reads (bench_update.py takes them too)."""
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--data-dir", type=Path, default=Path("data"))
    ap.add_argument("--tasks", nargs="+", default=["arith", "twohop"])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    # One thread on a loaded machine: two threads there wait on each other (2-20x slower).
    ap.add_argument("--threads", type=int, default=2)


def setup(args, tmp: Path):
    """The problems (half from the first task's test split, half from the last's), the
    checkpoint (``--checkpoint`` or a fresh tiny model in ``tmp``) loaded in eval mode, the
    tools, the tiny preset's agent settings and GRPO and CBPO at 16 slots."""
    from cbpo.tasks import generate_task

    data_dir = args.data_dir
    if not all((data_dir / "tasks" / task / "test.jsonl").is_file() for task in args.tasks):
        data_dir = tmp
        for task in args.tasks:
            generate_task(task, data_dir, 0, 200, 50)
    rows = load_split({"tasks": args.tasks}, data_dir, "test")
    ckpt = args.checkpoint
    if ckpt is None:
        texts = [x for r in load_split({"tasks": args.tasks}, data_dir, "train") for x in (r["question"], r["trace"])]
        ckpt = prepare_model("tiny", tmp / "tiny", corpus_texts=texts)
    model, tokenizer = load_model(ckpt)
    model.eval()
    tools = environment_tools(["python", "search"], ToolsConfig(python_timeout=5.0, search_k=3), seed=0)
    agent_cfg = AgentConfig(max_tool_calls=3, max_new_tokens=64, max_total_tokens=256, max_obs_tokens=96)
    half = args.problems // 2
    picked = rows[:half] + rows[-(args.problems - half):]  # both domains
    methods = {
        "grpo": get_method("grpo")(budget=16),
        "cbpo": get_method("cbpo")(vocab_size=len(tokenizer), budget=16, n0=6, w=4, d_min=8),
    }
    return picked, ckpt, model, tokenizer, tools, agent_cfg, methods


def verl_mode(workdir: Path) -> None:
    """The DAG's smoke-preset SFT checkpoint on verl in ``workdir``, then 2 steps on verl of GRPO
    and of CBPO with the entropy gate off (``method.kappa=0``: the smoke model's entropies are
    flat, so the paper's kappa never lets it branch); each step's rollout seconds and
    prefix-cache counts from the metrics lines."""
    runs = workdir / "runs" / "smoke" / "tiny" / "mix" / "seed0"
    paths = [f"paths.{name}_dir={workdir / name}" for name in ("data", "models", "runs")]
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("snakemake")), f"{runs.relative_to(workdir)}/sft/final/DONE.json",
                    "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "-c2", "--config", "preset=smoke", "backend=verl"],
                   check=True)
    methods = {"grpo": ["method=grpo"], "cbpo-kappa0": ["method=cbpo", "method.kappa=0", "run_name=cbpo-kappa0"]}
    for overrides in methods.values():
        subprocess.run([sys.executable, "-m", "cbpo.train", "stage=rl", "backend=verl", "preset=smoke",
                        "verl.gpus_per_node=1", *paths, *overrides], cwd=workdir, check=True)
    print(f"verl, smoke preset (2 problems x 4 slots a step); {time.perf_counter() - t0:.0f} s with SFT; "
          f"load average {os.getloadavg()[0]:.2f}; CPU {cpu_isa()}")
    share = {}
    for m in methods:
        lines = [json.loads(x) for x in (runs / m / "metrics.jsonl").read_text().splitlines()]
        for line in lines:
            print(f"{m} step {line['step']}: rollout {line['rollout_seconds']:.2f} s, branches {line['n_branch']}, "
                  f"prompt tokens {line['prefill_tokens']} (cache hits {line['prefill_cached_tokens']}, computed "
                  f"{line['prefill_computed_tokens']})")
        share[m] = sum(x["prefill_cached_tokens"] for x in lines) / max(1, sum(x["prefill_tokens"] for x in lines))
    print("verl cache-hit share " + " ".join(f"{m}={v:.3f}" for m, v in share.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    add_setup_args(ap)
    ap.add_argument("--engine", choices=["hf", "vllm", "verl"], default="hf",
                    help="rollout engine (vllm: also prefill tokens; verl: 2 smoke steps on verl, see above)")
    ap.add_argument("--workdir", type=Path, help="verl: the DAG's folder (default: a fresh temporary one, kept)")
    ap.add_argument("--admission", choices=["stream", "rounds", "both"], default="stream",
                    help="vllm: how rows join its running batch (both: each repeat under each, on one engine)")
    args = ap.parse_args()
    if args.engine == "verl":
        verl_mode(args.workdir or Path(tempfile.mkdtemp(prefix="bench_verl_")))
        return
    if args.engine == "hf" and args.admission != "stream":
        ap.error("--admission applies to --engine vllm (the HF engine always streams)")
    torch.set_num_threads(args.threads)
    admissions = ["stream", "rounds"] if args.admission == "both" else [args.admission]
    with tempfile.TemporaryDirectory() as tmp:
        picked, ckpt, model, tokenizer, tools, agent_cfg, methods = setup(args, Path(tmp))
        runs = {(name, a): [] for a in admissions for name in methods}
        load = os.getloadavg()[0]
        # One engine, as in training: its one-off set-up (the stop-string table) stays out of the timings.
        engine = build_engine(args.engine, ckpt, model, tokenizer)
        # Untimed: the first batch pays for allocator and kernel warm-up, which went to GRPO's first repeat.
        measure(methods["grpo"], picked[:1], engine, tokenizer, tools, agent_cfg)
        for rep in range(args.repeats):
            for admission in admissions:
                if args.engine == "vllm":
                    engine.admission = admission
                for name, method in methods.items():
                    start_run(engine, rep)
                    runs[name, admission].append(measure(method, picked, engine, tokenizer, tools, agent_cfg))
                    r = runs[name, admission][-1]
                    print(f"repeat {rep} {name} {admission}: generated tokens {r['tokens']}, wall {r['seconds']:.2f} s", flush=True)
    print(f"checkpoint: {args.checkpoint or 'fresh tiny model'}; engine {args.engine}; tasks {' '.join(args.tasks)}; "
          f"{args.problems} problems x 16 slots, median of {args.repeats} repeats; {torch.get_num_threads()} threads; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; CPU {cpu_isa()}")
    med = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in runs.items()}
    for (name, admission), t in med.items():
        vllm = (f", prompt tokens {t['prefill_tokens']:.0f} (cache hits {t['prefill_cached_tokens']:.0f}, computed "
                f"{t['prefill_computed_tokens']:.0f}), engine steps {t['engine_steps']:.0f}, "
                f"mean rows per step {t['engine_step_rows'] / max(t['engine_steps'], 1):.1f}") if "engine_steps" in t else ""
        print(f"{name} {admission}: rollouts {t['rollouts']:.0f}, branches {t['branches']:.0f}, generated tokens {t['tokens']:.0f}, "
              f"tool calls {t['tool_calls']:.0f}{vllm}, wall {t['seconds']:.2f} s, {t['tokens'] / t['seconds']:.0f} tok/s")
    excess = {}
    for admission in admissions:
        g, c = med["grpo", admission], med["cbpo", admission]
        ratios = [cr["seconds"] / gr["seconds"] for gr, cr in zip(runs["grpo", admission], runs["cbpo", admission])]
        prefill = (f", prefill computed {c['prefill_computed_tokens'] / g['prefill_computed_tokens']:.3f}"
                   if "engine_steps" in g else "")
        tokens, wall = c["tokens"] / g["tokens"], c["seconds"] / g["seconds"]
        excess[admission] = wall / tokens
        print(f"CBPO / GRPO {admission}: generated tokens {tokens:.3f}{prefill}, wall time {wall:.3f} "
              f"(per repeat: {', '.join(f'{x:.3f}' for x in ratios)}); excess (wall / tokens) {excess[admission]:.3f}")
    if args.admission == "both":
        for name in methods:
            print(f"{name} stream / rounds wall: {med[name, 'stream']['seconds'] / med[name, 'rounds']['seconds']:.3f}")
        print(f"excess stream={excess['stream']:.3f} rounds={excess['rounds']:.3f}; "
              f"cbpo stream/rounds={med['cbpo', 'stream']['seconds'] / med['cbpo', 'rounds']['seconds']:.3f}")


if __name__ == "__main__":
    main()
