"""Hydra entry for evaluation: one checkpoint on one benchmark, the same prompt, tools,
decoding and answer extraction for every method (Sec. 5.1 "Evaluation controls").

    python -m eval.run benchmark=arith run_name=cbpo model=tiny data=mix preset=tiny

Writes ``<eval_out>/samples.jsonl`` (resumable) and ``<eval_out>/summary.json``.
"""
from __future__ import annotations

import os
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from eval.benchmarks import benchmark_config, load_benchmark
from eval.runner import run_benchmark
from eval.scoring import scorer_for


def make_generate(model, tokenizer, tools, agent_cfg, temperature: float, seed: int, system_prompt: str | None):
    """The runner's ``generate(rows, n)`` on the rollout engine and agent loop."""
    from cbpo.chat import build_prompt
    from cbpo.rollout.agent import run_agent
    from cbpo.rollout.engine import HFEngine
    from cbpo.trajectory import Trajectory

    engine = HFEngine(model, tokenizer, temperature=temperature, generator=seed)

    def generate(rows, n):
        fresh = [Trajectory(prompt_ids=build_prompt(tokenizer, row["question"], system_prompt)) for row in rows for _ in range(n)]
        with torch.no_grad():
            done = run_agent(engine, tokenizer, fresh, tools, agent_cfg)
        texts = tokenizer.batch_decode([t.response_ids for t in done], skip_special_tokens=False)
        samples = [{"trajectory": text, "tokens": t.n_model_tokens, "tool_calls": t.tool_calls} for t, text in zip(done, texts)]
        return [samples[i * n : (i + 1) * n] for i in range(len(rows))]

    return generate


@hydra.main(config_path="../configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from cbpo.chat import resolve_system_prompt
    from cbpo.models import load_model
    from cbpo.rollout.agent import AgentConfig
    from cbpo.tools import build_tools
    from cbpo.trainer import DONE

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ckpt = Path(cfg.checkpoint)
    if not (ckpt / DONE).is_file():
        raise FileNotFoundError(f"checkpoint {ckpt} is not finished (no {DONE})")
    bench = cfg.benchmark
    rows = load_benchmark(bench, limit=cfg.evaluation.limit, tasks_dir=cfg.paths.data_dir)
    model, tokenizer = load_model(ckpt)
    # Every task offers both tools (Sec. 5.1); the built-in corpus serves search offline.
    tools = build_tools(["python", "search"], cfg.tools_cfg, search_seed=cfg.data.seed)
    agent_cfg = AgentConfig(**OmegaConf.to_container(cfg.rl.agent, resolve=True))
    generate = make_generate(model, tokenizer, tools, agent_cfg, cfg.evaluation.temperature, cfg.seed, resolve_system_prompt(cfg.system_prompt))
    scorer = scorer_for(bench, fallback=cfg.judge_fallback)
    try:
        summary = run_benchmark(
            rows, generate, cfg.eval_out, n_samples=cfg.evaluation.n_samples,
            batch_size=cfg.evaluation.batch_size, scorer=scorer, benchmark=bench, seed=cfg.seed,
        )
    finally:
        scorer.close()
    print(f"{benchmark_config(bench)['display_name']}: pass@1 = {summary.get('pass@1')} -> {cfg.eval_out}")


if __name__ == "__main__":
    main()
