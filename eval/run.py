"""Hydra entry for evaluation: one checkpoint on one benchmark, the same prompt, tools,
decoding and answer extraction for every method (Sec. 5.1 "Evaluation controls").

    python -m eval.run benchmark=arith run_name=cbpo model=tiny data=mix preset=tiny

Writes ``<eval_out>/samples.jsonl`` (resumable) and ``<eval_out>/summary.json``. The run
folder is named as training names it (``method.eta=0`` evaluates ``runs/.../cbpo-eta0``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Mapping

import torch
from omegaconf import DictConfig, OmegaConf

from cbpo.device import resolve_device, resolve_dtype
from cbpo.chat import split_observations
from cbpo.data import shared_data_dir, write_atomically
from cbpo.provenance import write_provenance
from cbpo.runs import checkpoint_fingerprint, name_run
from cbpo.registry import known_methods
from cbpo.schema import config_options, entry_point, settings
from eval.benchmarks import benchmark_config, list_benchmarks, load_benchmark
from eval.runner import run_benchmark
from eval.verifiers.scoring import make_scorer


def make_engine(engine: str, checkpoint: Path, device: torch.device, dtype: torch.dtype, temperature: float, seed: int):
    """``(engine, tokenizer)`` for ``evaluation.engine``: "hf" samples with the checkpoint in
    transformers on ``device``; "vllm" serves it with vLLM (its CPU build without a GPU), which
    reads the folder itself, so its tokenizer must already have the suite's tool tags (every
    checkpoint the suite saves does)."""
    if engine == "hf":
        from cbpo.models import load_model
        from cbpo.rollout.engine import HFEngine

        model, tokenizer = load_model(checkpoint, dtype)  # no training: the weights themselves in bf16
        model.to(device)
        return HFEngine(model, tokenizer, temperature=temperature, device=model.device, generator=seed), tokenizer
    from transformers import AutoTokenizer

    from cbpo.chat import tag_tokens
    from cbpo.rollout.vllm_engine import VLLMEngine

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    missing = [t for t in tag_tokens() if t not in tokenizer.get_vocab()]
    if missing or not (checkpoint / "config.json").is_file():
        raise ValueError(f"evaluation.engine=vllm serves {checkpoint} as it is saved, but "
                         + (f"its tokenizer lacks the tool tags {missing}" if missing else "it has no config.json")
                         + ": evaluate a checkpoint the suite saved, or use evaluation.engine=hf")
    dtype_name = str(dtype).removeprefix("torch.")
    return VLLMEngine(str(checkpoint), tokenizer, temperature=temperature, seed=seed, llm_kwargs={"dtype": dtype_name}), tokenizer


def make_generate(engine, tokenizer, tools, agent_cfg, system_prompt: str | None, prefixes: Mapping[str, str] | None = None):
    """The runner's ``generate(rows, n)`` on the rollout engine and agent loop; ``prefixes``
    (by row id): text each response starts with, its ``<result>`` blocks as observations."""
    from cbpo.chat import build_prompt
    from cbpo.rollout.agent import run_agent
    from cbpo.trajectory import Trajectory

    def start(row) -> Trajectory:
        t = Trajectory(prompt_ids=build_prompt(tokenizer, row["question"], system_prompt))
        for text, is_model in split_observations(prefixes[row["id"]] if prefixes else ""):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            t.response_ids += ids
            t.model_mask += [is_model] * len(ids)
            t.tool_calls += not is_model
        t.logprobs, t.entropies = [0.0] * len(t.response_ids), [0.0] * len(t.response_ids)
        t.copied_tool_calls = t.tool_calls
        return t

    def generate(rows, n):
        fresh = [start(row) for row in rows for _ in range(n)]
        with torch.no_grad():
            done = run_agent(engine, tokenizer, fresh, tools, agent_cfg)
        texts = tokenizer.batch_decode([t.response_ids for t in done], skip_special_tokens=False)
        samples = [{"trajectory": text, "tokens": t.n_model_tokens, "tool_calls": t.tool_calls} for t, text in zip(done, texts)]
        return [samples[i * n : (i + 1) * n] for i in range(len(rows))]

    return generate


# Which samples exist, not what any one of them is: resuming across these is sound.
_SELECTION = ("n_samples", "batch_size", "limit")


def forced_prefixes(cfg: DictConfig, bench: str) -> dict[str, str] | None:
    """``evaluation.forced``'s response starts by row id (``cbpo.tasks.forks.winning_prefixes``);
    None for an ordinary evaluation."""
    if not cfg.evaluation.forced:
        return None
    from cbpo.tasks import TASKS, has_decisions
    from cbpo.tasks.forks import winning_prefixes

    with_decisions = sorted(filter(has_decisions, TASKS))
    if bench not in with_decisions or bench not in cfg.data.tasks:
        raise ValueError(f"evaluation.forced={cfg.evaluation.forced} needs a task of the run's data with decisions; "
                         f"{bench} is not one (with decisions: {', '.join(with_decisions)})")
    options = OmegaConf.to_container(cfg.data.get("task_options") or {}, resolve=True)
    return winning_prefixes(bench, cfg.data.seed, cfg.data.n_test, cfg.evaluation.forced, options)


def eval_identity(cfg: DictConfig, checkpoint: Path, system_prompt: str | None) -> dict:
    """What a sample depends on: the checkpoint's weights and every setting that changes
    generation or scoring."""
    values = OmegaConf.to_container(cfg, resolve=True)
    config = benchmark_config(cfg.benchmark)
    return {
        "checkpoint": str(checkpoint),
        "fingerprint": checkpoint_fingerprint(checkpoint),
        "benchmark": cfg.benchmark,
        "evaluation": {k: v for k, v in values["evaluation"].items() if k not in _SELECTION},
        "agent": values["rl"]["agent"],
        # Where searches are cached changes no observation.
        "tools_cfg": {k: v for k, v in values["tools_cfg"].items() if k not in ("search_cache", "search_cache_seed")},
        "search_seed": cfg.data.seed,
        "system_prompt": system_prompt,
        "seed": cfg.seed,
        "dtype": cfg.dtype,  # bfloat16 forward passes sample differently
        "scoring": {"metric": config["metric"], "judge": judge_config(cfg), "fallback": cfg.judge_fallback},
    }


def judge_config(cfg: DictConfig) -> dict | None:
    """The benchmark's ``judge:`` block with the run's ``judge.*`` settings over it; None for
    a benchmark without a judge."""
    config = benchmark_config(cfg.benchmark).get("judge")
    if config is None:
        return None
    given = {k: v for k, v in OmegaConf.to_container(cfg.judge, resolve=True).items() if v is not None}
    return {**config, **given}


def record(summary: dict, out: str | Path, **fields) -> dict:
    """``fields`` added to the summary and to its file (written atomically, as the runner does)."""
    summary = {**summary, **fields}
    write_atomically(Path(out) / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def log_to_wandb(cfg: DictConfig, summary: dict) -> None:
    """The summary's headline numbers as a W&B run of job type ``eval`` in the evaluation
    folder, grouped with the study's training runs (nothing when ``wandb.enabled`` is off)."""
    from cbpo.runlog import open_wandb

    wandb_cfg = OmegaConf.to_container(cfg.wandb, resolve=True)
    wandb_cfg.update(job_type="eval", tags=[*wandb_cfg["tags"], cfg.benchmark])
    run = open_wandb(wandb_cfg, Path(cfg.eval_out), OmegaConf.to_container(cfg, resolve=True))
    if run is None:
        return
    pass_at_k = {f"pass@{k}": v for k, v in summary["pass@k"].items()}
    run.log({**pass_at_k, **{k: summary[k] for k in ("pass@1", "mean_tokens", "mean_tool_calls", "problems")}})
    run.finish()


def evaluate_only_row(cfg: DictConfig):
    """The config of a method that does not train (``base``, ``tir``, ``sft``), else None."""
    from cbpo.registry import get_method

    cls = get_method(cfg.method.name)
    if cls.trains:
        return None
    params = OmegaConf.to_container(cfg.method, resolve=True)
    params.pop("name")
    return cls(**params).cfg


def usage() -> str:
    return f"""python -m eval.run: evaluate one checkpoint on one benchmark (Pass@1, Pass@k, tokens, tool calls).

  python -m eval.run benchmark=arith run_name=cbpo preset=tiny          # runs/tiny/tiny/mix/seed0/cbpo/final
  python -m eval.run benchmark=arith method=cbpo method.eta=0 preset=tiny   # the run trained with those overrides
  python -m eval.run benchmark=arith method=sft preset=tiny             # a row that does not train (base, tir, sft)

Writes <eval_out>/samples.jsonl (resumable), summary.json, identity.json and provenance.json.

Settings people change:
  benchmark=NAME   method=NAME or run_name=NAME   preset=NAME   model=NAME   data=NAME   seed=N
  evaluation.n_samples=N  evaluation.temperature=T  evaluation.limit=N  checkpoint=DIR
  evaluation.engine=hf|vllm   (vllm: the paper preset's; without a GPU, vLLM's CPU build)
  evaluation.forced=K   (a task with decisions: the winning choice forced at its first K; eval.forced)

benchmarks: {', '.join(list_benchmarks())}
methods: {', '.join(known_methods())}
presets: {', '.join(config_options('preset'))}; models: {', '.join(config_options('model'))}
"""


@entry_point(usage=usage)
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from cbpo.chat import resolve_system_prompt
    from cbpo.models import resolve_model
    from cbpo.tasks import TASKS, environment_tools
    from cbpo.runs import DONE

    if cfg.benchmark not in list_benchmarks():  # named before any checkpoint is looked for
        sys.exit(f"invalid setting: benchmark={cfg.benchmark} is not a benchmark; known: {', '.join(list_benchmarks())}")
    try:
        prefixes = forced_prefixes(cfg, cfg.benchmark)
    except ValueError as e:
        sys.exit(f"invalid setting: {e}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    overrides = HydraConfig.get().overrides.task
    name_run(cfg, overrides)
    ckpt, system_prompt = Path(cfg.checkpoint), resolve_system_prompt(cfg.system_prompt)
    row = evaluate_only_row(cfg)
    if row is not None:  # Base / TIR / SFT rows: the model folder and prompt the row names
        if not any(o.startswith("checkpoint=") for o in overrides):
            ckpt = Path(cfg.init) if row.weights == "sft" else Path(resolve_model(cfg.model.name, Path(cfg.paths.models_dir)))
        system_prompt = resolve_system_prompt(row.system_prompt)
    if not ckpt.is_dir() or (row is None and not (ckpt / DONE).is_file()):
        raise FileNotFoundError(f"checkpoint {ckpt} is not finished (no {DONE})" if ckpt.is_dir() else f"no model folder at {ckpt}")
    bench = cfg.benchmark
    rows = load_benchmark(bench, data_dir=shared_data_dir(cfg.data_root), limit=cfg.evaluation.limit, tasks_dir=cfg.paths.data_dir)
    device = resolve_device(cfg.device)
    engine, tokenizer = make_engine(cfg.evaluation.engine, ckpt, device, resolve_dtype(cfg.dtype, device),
                                    cfg.evaluation.temperature, cfg.seed)
    # Every task offers both tools (Sec. 5.1); the built-in corpus of the benchmark's task (the
    # training data's, for any other benchmark) serves search offline.
    tools = environment_tools(["python", "search"], settings(cfg, "tools_cfg"), cfg.data.seed, cfg.data_root,
                              [bench] if bench in TASKS else cfg.data.tasks)
    agent_cfg = settings(cfg, "rl").agent
    generate = make_generate(engine, tokenizer, tools, agent_cfg, system_prompt, prefixes)
    scorer = make_scorer(benchmark_config(bench)["metric"], judge_config(cfg), fallback=cfg.judge_fallback)
    try:
        summary = run_benchmark(
            rows, generate, cfg.eval_out, n_samples=cfg.evaluation.n_samples,
            batch_size=cfg.evaluation.batch_size, scorer=scorer, benchmark=bench, seed=cfg.seed,
            identity=eval_identity(cfg, ckpt, system_prompt),
        )
        # This process's searches (a resumed evaluation counts only the samples it made).
        cache = tools["search"].cache
        search = {"backend": cfg.tools_cfg.search_backend or "built-in",
                  "cache": None if cache is None else str(cache.path), **tools["search"].stats()}
        summary = record(summary, cfg.eval_out, search=search, judge=scorer.judge and scorer.judge.settings())
    finally:
        scorer.close()
        if tools["search"].cache is not None:
            tools["search"].cache.close()  # adds this process's hits and misses to the file's totals
    write_provenance(cfg.eval_out, cfg, overrides)
    log_to_wandb(cfg, summary)
    print(f"{benchmark_config(bench)['display_name']}: pass@1 = {summary.get('pass@1')} -> {cfg.eval_out}")


if __name__ == "__main__":
    main()
