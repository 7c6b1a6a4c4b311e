"""What a run leaves behind, shared by both backends and evaluation: atomic checkpoints (their
``DONE.json`` carries the weights' fingerprint, ``cbpo.runs``), the process's RNG state, the
append-only ``metrics.jsonl`` beside an optional W&B run."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from cbpo.data import read_appended, write_atomically
from cbpo.runs import DONE, fingerprint


def save_checkpoint(path: Path, model, tokenizer, state: Mapping[str, Any]) -> None:
    """Write model, tokenizer and trainer state to ``path`` atomically (tmp dir + rename).
    DONE.json records the weights' fingerprint: what an evaluation or a run started from it
    is keyed on."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(dict(state), tmp / "trainer_state.pt")
    (tmp / DONE).write_text(json.dumps({"step": state.get("step"), "fingerprint": fingerprint(tmp)}) + "\n")
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)

def latest_checkpoint(run_dir: Path) -> Path | None:
    done = [p for p in Path(run_dir).glob("step_*") if (p / DONE).is_file()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}

def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


WANDB_TAG_MAX = 64  # W&B refuses a longer tag, and with it the whole run


def wandb_tag(tag: str) -> str:
    """``tag`` within W&B's 64 characters: a longer one (a run named by a ``method.*=PATH``
    override) keeps its start and ends in a hash of the whole, so two long tags stay apart."""
    if len(tag) <= WANDB_TAG_MAX:
        return tag
    digest = hashlib.sha1(tag.encode()).hexdigest()[:8]
    return f"{tag[: WANDB_TAG_MAX - len(digest) - 1]}-{digest}"

def open_wandb(wandb_cfg: Mapping[str, Any] | None, folder: Path, run_config: Mapping[str, Any] | None = None):
    """A W&B run in ``<folder>/wandb`` named, grouped, typed and tagged as ``wandb.*`` says
    (``configs/config.yaml``), offline unless WANDB_MODE or ``wandb.mode`` says otherwise;
    None when ``wandb.enabled`` is off."""
    if not wandb_cfg or not wandb_cfg.get("enabled", False):
        return None
    import wandb

    os.environ.setdefault("WANDB_MODE", wandb_cfg.get("mode", "offline"))
    return wandb.init(
        project=wandb_cfg.get("project", "cbpo"),
        name=wandb_cfg.get("name"),
        group=wandb_cfg.get("group"),
        job_type=wandb_cfg.get("job_type"),
        tags=[wandb_tag(str(t)) for t in wandb_cfg.get("tags") or []],
        dir=str(folder),
        config=dict(run_config or {}),
        reinit=True,
    )


class MetricsLog:
    """JSONL metrics (append-only, survives crashes) and W&B (offline unless configured)."""

    def __init__(self, path: Path, wandb_cfg: Mapping[str, Any] | None = None, run_config: Mapping[str, Any] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wandb = open_wandb(wandb_cfg, self.path.parent, run_config)

    def log(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log(dict(record), step=record.get("step"))

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps the checkpoint does not contain, and a write torn
        by a kill (``cbpo.data.read_appended``: other damage is an error naming the line)."""
        if not self.path.exists():
            return
        records, _ = read_appended(self.path, "metrics record")
        keep = [record for _, record in records if record.get("step", 0) <= step]
        write_atomically(self.path, "".join(json.dumps(record) + "\n" for record in keep))

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
