"""Hydra entry for training.

    python -m cbpo.train stage=sft model=tiny data=mix preset=tiny
    python -m cbpo.train stage=rl method=cbpo model=tiny data=mix preset=tiny

Writes ``<out>/final`` (model + tokenizer + DONE.json, the last file written), metrics to
``<out>/metrics.jsonl``, and resumable checkpoints ``<out>/step_*`` while running; a rerun
resumes them only when ``run_key.json`` (what the weights depend on) still matches.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cbpo.registry import get_method, known_methods
from cbpo.runs import WEIGHT_SETTINGS, name_run
from cbpo.schema import backend_launcher, config_options, entry_point


def _threads() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


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
    backend_launcher(cfg.backend)(cfg, out)  # a backend package registers its launcher (cbpo.schema)


if __name__ == "__main__":
    main()
