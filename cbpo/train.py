"""Hydra entry for training.

    python -m cbpo.train stage=sft model=tiny data=mix preset=tiny
    python -m cbpo.train stage=rl method=cbpo model=tiny data=mix preset=tiny

Writes ``<out>/final`` (model + tokenizer + DONE.json, the last file written), metrics to
``<out>/metrics.jsonl``, and resumable checkpoints ``<out>/step_*`` while running.
"""
from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from cbpo.chat import resolve_system_prompt
from cbpo.data import load_split
from cbpo.trainer import DONE, MetricsLog, RLConfig, SFTConfig, rl_train, save_checkpoint, sft


def _dataclass_from(cls, node) -> object:
    values = OmegaConf.to_container(node, resolve=True) or {}
    known = set(inspect.signature(cls).parameters)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)


def build_method(cfg: DictConfig, vocab_size: int):
    from cbpo.registry import get_method

    params = OmegaConf.to_container(cfg.method, resolve=True)
    name = params.pop("name")
    return get_method(name)(vocab_size=vocab_size, **params)


def _threads() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@hydra.main(config_path="../configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from cbpo.models import load_model, resolve_model

    _threads()
    torch.manual_seed(cfg.seed)
    stage = cfg.stage
    out = Path(cfg.out if stage == "rl" else Path(cfg.paths.runs_dir) / cfg.model.name / cfg.data.name / "sft")
    final = out / "final"
    if (final / DONE).is_file():
        print(f"already finished: {final}")
        return
    rows = load_split(cfg.data, cfg.paths.data_dir, "train")
    log = MetricsLog(out / "metrics.jsonl", cfg.wandb, OmegaConf.to_container(cfg, resolve=True))
    t0 = time.perf_counter()
    try:
        if stage == "sft":
            model, tokenizer = load_model(resolve_model(cfg.model.name, Path(cfg.paths.models_dir)))
            sft(model, tokenizer, rows, _dataclass_from(SFTConfig, cfg.sft), out, log, resolve_system_prompt(cfg.system_prompt))
        elif stage == "rl":
            init = Path(cfg.init)
            if not (init / DONE).is_file():
                raise FileNotFoundError(f"RL starts from {init}, which is not a finished checkpoint (run stage=sft first)")
            from cbpo.reward import Rewarder
            from cbpo.tools import build_tools

            model, tokenizer = load_model(init)
            method = build_method(cfg, vocab_size=len(tokenizer))
            tools = build_tools(cfg.data.tools, cfg.tools_cfg, search_seed=cfg.data.seed)
            rewarder = Rewarder()
            try:
                rl_train(model, tokenizer, method, rows, tools, rewarder, _dataclass_from(RLConfig, cfg.rl), out, log,
                         resolve_system_prompt(cfg.system_prompt))
            finally:
                rewarder.close()
        else:
            raise ValueError(f"stage must be 'sft' or 'rl', got {stage!r}")
    finally:
        log.close()
    save_checkpoint(final, model, tokenizer, {"step": "final", "seconds": time.perf_counter() - t0})
    (out / "run.json").write_text(json.dumps({"seconds": time.perf_counter() - t0, "config": OmegaConf.to_container(cfg, resolve=True)}, indent=1))
    print(f"wrote {final}")


if __name__ == "__main__":
    main()
