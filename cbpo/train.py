"""Hydra entry for training.

    python -m cbpo.train stage=sft model=tiny data=mix preset=tiny
    python -m cbpo.train stage=rl method=cbpo model=tiny data=mix preset=tiny

Writes ``<out>/final`` (model + tokenizer + DONE.json, the last file written), metrics to
``<out>/metrics.jsonl``, and resumable checkpoints ``<out>/step_*`` while running; a rerun
resumes them only when ``run_key.json`` (what the weights depend on) still matches.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cbpo.backends.device import resolve_device, resolve_dtype
from cbpo.chat import resolve_system_prompt
from cbpo.data import load_split, write_atomically
from cbpo.provenance import write_provenance
from cbpo.runs import WriterLock, checkpoint_fingerprint, name_run
from cbpo.schema import entry_point, settings
from cbpo.trainer import DONE, MetricsLog, rl_train, save_checkpoint, sft


def build_method(cfg: DictConfig, vocab_size: int):
    """The method named by ``method.name`` with every other ``method.*`` setting."""
    from cbpo.registry import get_method

    params = OmegaConf.to_container(cfg.method, resolve=True)
    name = params.pop("name")
    return get_method(name)(vocab_size=vocab_size, **params)


def _threads() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


# The settings a stage's weights depend on; evaluation.*, wandb.*, paths.* and benchmark only
# say where outputs go or what is measured afterwards. Rollout and scan feed the method.
# backend and dtype change the arithmetic that produces the weights; the device alone does not.
_WEIGHT_SETTINGS = {
    "sft": ("model", "data", "sft", "system_prompt", "seed", "backend", "dtype"),
    "rl": ("model", "data", "method", "rollout", "scan", "rl", "tools_cfg", "system_prompt", "seed", "backend", "dtype"),
}
_BOOKKEEPING = ("log_every", "checkpoint_every", "dump_rollouts", "dump_every")  # when to record, not what is learnt


def run_identity(cfg: DictConfig, rows, init: str | Path) -> dict:
    """What a run's weights depend on: its stage's settings, its training rows and the
    fingerprint of the checkpoint it starts from (SFT: the prepared model)."""
    values = OmegaConf.to_container(cfg, resolve=True)
    key = {name: values.get(name) for name in _WEIGHT_SETTINGS[cfg.stage]}
    key[cfg.stage] = {k: v for k, v in key[cfg.stage].items() if k not in _BOOKKEEPING}
    key["stage"] = cfg.stage
    key["rows"] = hashlib.sha256(json.dumps(list(rows), sort_keys=True).encode()).hexdigest()
    key["init"] = checkpoint_fingerprint(init)
    return json.loads(json.dumps(key, sort_keys=True))  # as it reads back from run_key.json


def _forget_stale_run(out: Path, identity: dict) -> None:
    """Resume only a run of the same identity: a run whose weights-relevant settings or
    starting checkpoint changed starts from scratch instead of picking up checkpoints of the
    old one. A finished run of other settings is never overwritten."""
    key_file = out / "run_key.json"
    old = json.loads(key_file.read_text()) if key_file.is_file() else None
    if old == identity:
        return
    changed = ", ".join(sorted(k for k in identity if old is None or old.get(k) != identity[k]))
    if (out / "final" / DONE).is_file():
        raise RuntimeError(f"{out / 'final'} was trained with other settings ({changed}): name this run "
                           f"with variant=..., or delete {out} to retrain it")
    stale = [*out.glob("step_*"), out / "metrics.jsonl", out / "rollouts", out / "wandb"]
    if any(p.exists() for p in stale):
        print(f"{out}: {changed} changed since the last run; starting afresh")
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    write_atomically(key_file, json.dumps(identity, indent=1, sort_keys=True) + "\n")


@entry_point
def main(cfg: DictConfig) -> None:
    from cbpo.models import load_model, resolve_model

    _threads()
    torch.manual_seed(cfg.seed)
    stage = cfg.stage
    if stage not in _WEIGHT_SETTINGS:
        raise ValueError(f"stage must be 'sft' or 'rl', got {stage!r}")
    if stage == "rl":
        from cbpo.registry import get_method

        if not get_method(cfg.method.name).trains:
            raise ValueError(f"method {cfg.method.name!r} does not train: evaluate it with "
                             f"`python -m eval.run method={cfg.method.name} benchmark=...`")
    overrides = HydraConfig.get().overrides.task
    name_run(cfg, overrides)
    out = Path(cfg.out if stage == "rl" else Path(cfg.init).parent)  # the SFT run is the one RL starts from
    if stage == "sft":  # named by its folder (sft; OPD's teacher), not by a method it does not train
        cfg.run_name = out.name
    if cfg.backend == "verl":
        from cbpo.backends.verl.launch import run_verl

        return run_verl(cfg, out)
    device = resolve_device(cfg.device)  # before anything is written: device=cuda without a GPU stops here
    dtype = resolve_dtype(cfg.dtype, device)
    final = out / "final"
    rows = load_split(cfg.data, cfg.paths.data_dir, stage if stage == "sft" else "train")
    init = Path(cfg.init) if stage == "rl" else resolve_model(cfg.model.name, Path(cfg.paths.models_dir))
    if stage == "rl" and not (init / DONE).is_file():
        raise FileNotFoundError(f"RL starts from {init}, which is not a finished checkpoint (run stage=sft first)")
    identity = run_identity(cfg, rows, init)
    if (final / DONE).is_file():
        _forget_stale_run(out, identity)  # refuses a finished run of other settings
        print(f"already finished: {final}")
        return
    writer = WriterLock(out)  # one process writes a run; the kernel frees it when this one ends
    _forget_stale_run(out, identity)
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
