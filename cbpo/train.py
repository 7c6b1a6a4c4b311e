"""Hydra entry for training.

    python -m cbpo.train stage=sft model=tiny data=mix preset=tiny
    python -m cbpo.train stage=rl method=cbpo model=tiny data=mix preset=tiny

Writes ``<out>/final`` (model + tokenizer + DONE.json, the last file written), metrics to
``<out>/metrics.jsonl``, and resumable checkpoints ``<out>/step_*`` while running; a rerun
resumes them only when ``run_key.json`` (what the weights depend on) still matches.
"""
from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cbpo.backends.device import resolve_device, resolve_dtype
from cbpo.chat import resolve_system_prompt
from cbpo.data import load_split
from cbpo.provenance import write_provenance
from cbpo.registry import build_method, get_method, known_methods
from cbpo.runs import WEIGHT_SETTINGS, WriterLock, forget_stale_run, name_run, run_identity
from cbpo.schema import config_options, entry_point, settings
from cbpo.trainer import DONE, MetricsLog, rl_train, save_checkpoint, sft


def _threads() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


# backend -> "module:function(cfg, out)", imported on use (verl's import alone costs seconds).
# A backend is a package that imports the core; the core never imports a backend.
BACKENDS = {"local": f"{__name__}:run_local", "verl": "cbpo.backends.verl.launch:run_verl"}


def usage() -> str:
    trained = [m for m in known_methods() if get_method(m).trains]
    return f"""python -m cbpo.train: train one run, the shared SFT initialisation or an RL method from it.

  python -m cbpo.train stage=sft preset=tiny                 # runs/tiny/tiny/mix/seed0/sft/final
  python -m cbpo.train stage=rl method=cbpo preset=tiny      # runs/tiny/tiny/mix/seed0/cbpo/final

Writes <run>/final (weights, tokenizer, DONE.json last), <run>/metrics.jsonl and step_* checkpoints;
a rerun resumes them while run_key.json (what the weights depend on) still matches.

Settings people change:
  stage=sft|rl        method=NAME     preset=NAME     model=NAME     data=NAME     seed=N
  method.KEY=VALUE    (e.g. method.eta=0 is CBPO w/o CBV; variant=NAME names such a run)
  rl.steps=N  rl.dump_rollouts=true  backend=local|verl  device=auto|cpu|cuda

methods that train: {', '.join(trained)}   (python -m cbpo methods describes each)
presets: {', '.join(config_options('preset'))}; models: {', '.join(config_options('model'))}
data: {', '.join(config_options('data'))}
"""


@entry_point(usage=usage)
def main(cfg: DictConfig) -> None:
    _threads()
    torch.manual_seed(cfg.seed)
    stage = cfg.stage
    if stage not in WEIGHT_SETTINGS:
        raise ValueError(f"stage must be 'sft' or 'rl', got {stage!r}")
    if stage == "rl":
        if not get_method(cfg.method.name).trains:
            raise ValueError(f"method {cfg.method.name!r} does not train: evaluate it with "
                             f"`python -m eval.run method={cfg.method.name} benchmark=...`")
    overrides = HydraConfig.get().overrides.task
    name_run(cfg, overrides)
    out = Path(cfg.out if stage == "rl" else Path(cfg.init).parent)  # the SFT run is the one RL starts from
    if stage == "sft":  # named by its folder (sft; OPD's teacher), not by a method it does not train
        cfg.run_name = out.name
    if cfg.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {cfg.backend!r}")
    module, function = BACKENDS[cfg.backend].split(":")
    getattr(importlib.import_module(module), function)(cfg, out)


def run_local(cfg: DictConfig, out: Path) -> None:
    """One process on this machine (CPU or one GPU): the suite's own trainer (cbpo/trainer.py)."""
    from cbpo.models import load_model, resolve_model

    stage = cfg.stage
    overrides = HydraConfig.get().overrides.task
    device = resolve_device(cfg.device)  # before anything is written: device=cuda without a GPU stops here
    dtype = resolve_dtype(cfg.dtype, device)
    final = out / "final"
    rows = load_split(cfg.data, cfg.paths.data_dir, stage if stage == "sft" else "train")
    init = Path(cfg.init) if stage == "rl" else resolve_model(cfg.model.name, Path(cfg.paths.models_dir))
    if stage == "rl" and not (init / DONE).is_file():
        raise FileNotFoundError(f"RL starts from {init}, which is not a finished checkpoint (run stage=sft first)")
    identity = run_identity(cfg, rows, init)
    if (final / DONE).is_file():
        forget_stale_run(out, identity)  # refuses a finished run of other settings
        print(f"already finished: {final}")
        return
    writer = WriterLock(out)  # one process writes a run; the kernel frees it when this one ends
    forget_stale_run(out, identity)
    write_provenance(out, cfg, overrides)
    log = MetricsLog(out / "metrics.jsonl", cfg.wandb, OmegaConf.to_container(cfg, resolve=True))
    t0 = time.perf_counter()
    try:
        if stage == "sft":
            model, tokenizer = load_model(init)
            model.to(device)
            sft(model, tokenizer, rows, settings(cfg, "sft"), out, log, resolve_system_prompt(cfg.system_prompt), dtype)
        elif stage == "rl":
            from cbpo.reward import Rewarder
            from cbpo.tools import build_tools

            model, tokenizer = load_model(init)
            model.to(device)  # before the method's setup hook: OPD's teacher follows the policy's device
            method = build_method(cfg, vocab_size=len(tokenizer))
            tools = build_tools(cfg.data.tools, cfg.tools_cfg, search_seed=cfg.data.seed, data_root=cfg.data_root)
            rewarder = Rewarder()
            try:
                rl_train(model, tokenizer, method, rows, tools, rewarder, settings(cfg, "rl"), out, log,
                         resolve_system_prompt(cfg.system_prompt), dtype)
            finally:
                rewarder.close()
    finally:
        log.close()
    save_checkpoint(final, model, tokenizer, {"step": "final", "seconds": time.perf_counter() - t0})
    (out / "run.json").write_text(json.dumps({"seconds": time.perf_counter() - t0, "config": OmegaConf.to_container(cfg, resolve=True)}, indent=1))
    print(f"wrote {final}")


if __name__ == "__main__":
    main()
