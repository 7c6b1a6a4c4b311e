"""Supervised fine-tuning on tool traces (the SFT row and every RL run's start), loss on the
model's own tokens only."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from cbpo.backends.local.state import resume, save_state
from cbpo.chat import SYSTEM_PROMPT, encode_trace
from cbpo.device import autocast
from cbpo.runlog import MetricsLog
from cbpo.stages import SFTConfig


def _lr_lambda(cfg: SFTConfig) -> Callable[[int], float]:
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.decay == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + np.cos(np.pi * progress))

    return factor

def _right_padded(seqs: Sequence[list[int]], value: int) -> torch.Tensor:
    width = max(len(x) for x in seqs)
    return torch.tensor([x + [value] * (width - len(x)) for x in seqs])

def sft(
    model, tokenizer, rows: Sequence[Mapping[str, Any]], cfg: SFTConfig, run_dir: Path, log: MetricsLog,
    system_prompt: str | None = SYSTEM_PROMPT, dtype: torch.dtype = torch.float32,
) -> None:
    """Supervised fine-tuning on the rows' traces, loss on model tokens only, on the model's
    device with forward passes in ``dtype``."""
    if not rows:
        raise ValueError("SFT needs at least one training row")
    examples = [encode_trace(tokenizer, r["question"], r["trace"], system_prompt) for r in rows]
    too_long = sum(len(ids) > cfg.max_len for ids, _ in examples)
    if too_long:
        raise ValueError(f"{too_long} SFT examples exceed max_len={cfg.max_len} tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    start = resume(run_dir, model, opt, sched, log)
    pad = tokenizer.pad_token_id
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="sft", dynamic_ncols=True)
    model.train()
    since = time.perf_counter()  # each record carries the seconds since the last: their sum survives resumes
    for step in bar:
        rng = np.random.default_rng([cfg.seed, step])  # batch depends only on (seed, step): resumable
        batch = sorted((examples[i] for i in rng.integers(0, len(examples), cfg.batch_size)), key=lambda e: len(e[0]))
        n_target = sum(sum(m[1:]) for _, m in batch)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for chunk in np.array_split(np.arange(len(batch)), max(1, min(cfg.micro_batches, len(batch)))):
            ids = _right_padded([batch[i][0] for i in chunk], pad).to(model.device)
            attn = _right_padded([[1] * len(batch[i][0]) for i in chunk], 0).to(model.device)
            m = _right_padded([batch[i][1] for i in chunk], 0)[:, 1:].float().to(model.device)
            with autocast(model.device, dtype):
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
            part = (nll.view_as(m) * m).sum() / n_target  # token mean over the whole batch
            part.backward()
            loss += part.item()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss:.3f}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            now = time.perf_counter()
            log.log({"step": step + 1, "sft_loss": loss, "lr": sched.get_last_lr()[0], "wall_seconds": now - since})
            since = now
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_state(run_dir, step + 1, model, tokenizer, opt, sched)
