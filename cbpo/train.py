"""Hydra entry for training.

    python -m cbpo.train stage=sft model=tiny data=mix preset=tiny
    python -m cbpo.train stage=rl method=cbpo model=tiny data=mix preset=tiny

Writes ``<out>/final`` (model + tokenizer + DONE.json, the last file written), metrics to
``<out>/metrics.jsonl``, and resumable checkpoints ``<out>/step_*`` while running.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
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


def _forget_stale_run(out: Path, cfg: DictConfig) -> None:
    """Resume only a run of the same configuration (and, for RL, the same starting
    checkpoint): a step rerun because its inputs changed starts from scratch instead of
    picking up checkpoints of the old configuration."""
    key = {"config": OmegaConf.to_container(cfg, resolve=True)}
    init_done = Path(cfg.init) / DONE
    if cfg.stage == "rl" and init_done.is_file():
        key["init"] = init_done.stat().st_mtime_ns
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    key_file = out / "run_key.txt"
    if key_file.is_file() and key_file.read_text().strip() != digest:
        print(f"{out}: configuration changed since the last run; starting afresh")
        for stale in [*out.glob("step_*"), out / "metrics.jsonl", out / "rollouts", out / "wandb"]:
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    key_file.write_text(digest + "\n")


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
    _forget_stale_run(out, cfg)
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
