"""A local run's resumable state: the newest step checkpoint with the optimiser, scheduler and
every random generator the run draws from, so a resumed run continues as an uninterrupted one."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from cbpo.runlog import MetricsLog, latest_checkpoint, rng_state, save_checkpoint, set_rng_state


def save_state(run_dir: Path, step: int, model, tokenizer, opt, sched, sampler: torch.Generator | None = None,
                method_rng: np.random.Generator | None = None) -> None:
    """``sampler`` is the rollout engine's generator and ``method_rng`` a method's own (tree
    expansions, branch draws): saved, so a resumed run samples exactly what an uninterrupted
    one would have."""
    state = {"step": step, "optimizer": opt.state_dict(), "rng": rng_state()}
    if sched is not None:
        state["scheduler"] = sched.state_dict()
    if sampler is not None:
        state["sampler"] = sampler.get_state()
    if method_rng is not None:
        state["method_rng"] = method_rng.bit_generator.state
    save_checkpoint(Path(run_dir) / f"step_{step:06d}", model, tokenizer, state)
    for old in Path(run_dir).glob("step_*"):  # keep the newest only: these are for resuming
        if old.name != f"step_{step:06d}":
            shutil.rmtree(old, ignore_errors=True)

def resume(run_dir: Path, model, opt, sched, log: MetricsLog, sampler: torch.Generator | None = None,
            method_rng: np.random.Generator | None = None) -> int:
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        log.truncate_after(0)
        return 0
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    opt.load_state_dict(state["optimizer"])
    if sched is not None and "scheduler" in state:
        sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    if sampler is not None:
        sampler.set_state(state["sampler"])
    if method_rng is not None:
        method_rng.bit_generator.state = state["method_rng"]
    log.truncate_after(state["step"])
    tqdm.write(f"resuming from {ckpt} (step {state['step']})")
    return int(state["step"])
