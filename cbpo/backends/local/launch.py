"""``backend=local``: one training run in this process, as ``python -m cbpo.train`` hands it over
(the run folder named, its stage checked): the data, the model on its device, the run's
identity and provenance, then the SFT or RL loop and the final checkpoint."""
from __future__ import annotations

import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cbpo.backends.local.rl import rl_train
from cbpo.backends.local.sft import sft
from cbpo.chat import resolve_system_prompt
from cbpo.data import load_split
from cbpo.device import resolve_device, resolve_dtype
from cbpo.models import load_model, resolve_model
from cbpo.registry import build_method
from cbpo.reward import Rewarder
from cbpo.runlog import MetricsLog, save_checkpoint
from cbpo.runs import claim_run
from cbpo.schema import settings
from cbpo.tasks import environment_tools


def run_local(cfg: DictConfig, out: Path) -> None:
    """One process on this machine (CPU or one GPU): the suite's own loops (sft.py, rl.py)."""
    stage = cfg.stage
    device = resolve_device(cfg.device)  # before anything is written: device=cuda without a GPU stops here
    dtype = resolve_dtype(cfg.dtype, device)
    final = out / "final"
    rows = load_split(cfg.data, cfg.paths.data_dir, stage if stage == "sft" else "train")
    init = Path(cfg.init) if stage == "rl" else resolve_model(cfg.model.name, Path(cfg.paths.models_dir))
    writer = claim_run(cfg, out, rows, init)
    if writer is None:
        return
    with writer:
        log = MetricsLog(out / "metrics.jsonl", cfg.wandb, OmegaConf.to_container(cfg, resolve=True))
        t0 = time.perf_counter()
        try:
            model, tokenizer = load_model(init)
            model.to(device)  # before the method's setup hook: OPD's teacher follows the policy's device
            system_prompt = resolve_system_prompt(cfg.system_prompt)
            if stage == "sft":
                sft(model, tokenizer, rows, settings(cfg, "sft"), out, log, system_prompt, dtype)
            else:
                method = build_method(cfg, vocab_size=len(tokenizer))
                tools = environment_tools(cfg.data.tools, settings(cfg, "tools_cfg"), cfg.data.seed, cfg.data_root,
                                          cfg.data.tasks)
                rewarder = Rewarder()
                try:
                    rl_train(model, tokenizer, method, rows, tools, rewarder, settings(cfg, "rl"), out, log,
                             system_prompt, dtype)
                finally:
                    rewarder.close()
        finally:
            log.close()
        save_checkpoint(final, model, tokenizer, {"step": "final", "seconds": time.perf_counter() - t0})
        (out / "run.json").write_text(json.dumps({"seconds": time.perf_counter() - t0, "config": OmegaConf.to_container(cfg, resolve=True)}, indent=1))
        print(f"wrote {final}")
