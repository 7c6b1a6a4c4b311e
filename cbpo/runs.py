"""What identifies a run's outputs, shared by training and evaluation and by every backend:
checkpoint fingerprints, run folder names (variants), a training run's identity and the clean-up
of a stale one, and the one-writer lock on an output folder."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

DONE = "DONE.json"  # written last: a directory without it is not a finished output
# Neither changes what the checkpoint computes: DONE.json holds the fingerprint itself and
# trainer_state.pt the optimiser state and wall time.
_NOT_WEIGHTS = {DONE, "trainer_state.pt"}
LOCK = "writer.lock"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def fingerprint(folder: str | Path) -> str:
    """sha256 over a checkpoint folder's files (weights, config, tokenizer), names included."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in _NOT_WEIGHTS):
        digest.update(f"{path.relative_to(folder).as_posix()}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def checkpoint_fingerprint(checkpoint: str | Path) -> str:
    """The fingerprint recorded in a finished checkpoint's DONE.json; a prepared model folder
    without one is hashed, and a hub id (no folder) is its own identity."""
    path = Path(checkpoint)
    if not path.is_dir():
        return str(checkpoint)
    done = path / DONE
    if done.is_file():
        recorded = json.loads(done.read_text()).get("fingerprint")
        if recorded:
            return recorded
    return fingerprint(path)


def name_run(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Set ``cfg.run_name``, the run folder that ``out``, ``checkpoint`` and ``eval_out`` name,
    from the command line ``overrides``: an explicit ``run_name=`` stays; else ``variant`` if
    given; else the method's name plus its ``method.*`` overrides, sorted (``method.eta=0`` ->
    ``cbpo-eta0``), so ablations of one method never share (and resume) each other's runs."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if any(o.key_or_group == "run_name" for o in parsed):
        return
    if cfg.variant is not None:
        if not _SAFE.fullmatch(str(cfg.variant)):
            raise ValueError(f"variant={cfg.variant!r}: use letters, digits, '.', '_' and '-' (it names a folder)")
        cfg.run_name = str(cfg.variant)
        return
    parts = []
    for override in parsed:
        key = override.key_or_group
        if key.startswith("method."):
            value = "" if override.is_delete() else override.get_value_element_as_str()
            parts.append(re.sub(r"[^A-Za-z0-9._-]+", "_", key.removeprefix("method.") + value).strip("._-"))
    cfg.run_name = "-".join([cfg.method.name, *sorted(parts)])


# The settings a stage's weights depend on; evaluation.*, wandb.*, paths.* and benchmark only
# say where outputs go or what is measured afterwards. Rollout and scan feed the method.
# backend and dtype change the arithmetic that produces the weights; the device alone does not.
WEIGHT_SETTINGS = {
    "sft": ("model", "data", "sft", "system_prompt", "seed", "backend", "dtype"),
    "rl": ("model", "data", "method", "rollout", "scan", "rl", "tools_cfg", "system_prompt", "seed", "backend", "dtype"),
}
_BOOKKEEPING = ("log_every", "checkpoint_every", "dump_rollouts", "dump_every")  # when to record, not what is learnt
RUN_KEY = "run_key.json"


def run_identity(cfg: DictConfig, rows, init: str | Path) -> dict:
    """What a run's weights depend on: its stage's settings, its training rows and the
    fingerprint of the checkpoint it starts from (SFT: the prepared model)."""
    values = OmegaConf.to_container(cfg, resolve=True)
    key = {name: values.get(name) for name in WEIGHT_SETTINGS[cfg.stage]}
    key[cfg.stage] = {k: v for k, v in key[cfg.stage].items() if k not in _BOOKKEEPING}
    key["stage"] = cfg.stage
    key["rows"] = hashlib.sha256(json.dumps(list(rows), sort_keys=True).encode()).hexdigest()
    key["init"] = checkpoint_fingerprint(init)
    return json.loads(json.dumps(key, sort_keys=True))  # as it reads back from run_key.json


def forget_stale_run(out: Path, identity: dict, backend_state: Sequence[str] = ()) -> None:
    """Resume only a run of the same identity: a run whose weights-relevant settings or
    starting checkpoint changed starts from scratch instead of picking up checkpoints of the
    old one (``backend_state``: a backend's own resumable folders in ``out``, e.g. verl's). A
    finished run of other settings is never overwritten."""
    from cbpo.data import write_atomically

    key_file = out / RUN_KEY
    old = json.loads(key_file.read_text()) if key_file.is_file() else None
    if old == identity:
        return
    changed = ", ".join(sorted(k for k in identity if old is None or old.get(k) != identity[k]))
    if (out / "final" / DONE).is_file():
        raise RuntimeError(f"{out / 'final'} was trained with other settings ({changed}): name this run "
                           f"with variant=..., or delete {out} to retrain it")
    stale = [*out.glob("step_*"), out / "metrics.jsonl", out / "rollouts", out / "wandb", *(out / b for b in backend_state)]
    if any(p.exists() for p in stale):
        print(f"{out}: {changed} changed since the last run; starting afresh")
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    write_atomically(key_file, json.dumps(identity, indent=1, sort_keys=True) + "\n")


class WriterLock:
    """An exclusive claim on an output folder: ``flock`` on ``<folder>/writer.lock``, which
    holds the holder's PID. The kernel drops the claim when the holder exits, even by kill -9,
    so a dead holder's lock is simply taken over; a live one makes this raise at once."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise RuntimeError(f"{folder} is being written by process {holder} (lock {self.path}); "
                               "wait for it to finish or stop it") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_run(cfg: DictConfig, out: Path, rows, init: str | Path, backend_state: Sequence[str] = ()) -> WriterLock | None:
    """A training run's folder, claimed as every backend claims it: None when the run is
    finished (of these settings; of others it refuses); else this process's writer lock, with
    stale outputs of other settings gone (``backend_state``: the backend's own resumable
    folders) and provenance written. ``init``: the checkpoint the run starts from, which an RL
    run needs finished."""
    from hydra.core.hydra_config import HydraConfig

    from cbpo.provenance import write_provenance

    if cfg.stage == "rl" and not (Path(init) / DONE).is_file():
        raise FileNotFoundError(f"RL starts from {init}, which is not a finished checkpoint (run stage=sft first)")
    identity = run_identity(cfg, rows, init)
    if (out / "final" / DONE).is_file():
        forget_stale_run(out, identity)  # refuses a finished run of other settings
        print(f"already finished: {out / 'final'}")
        return None
    writer = WriterLock(out)  # one process writes a run; the kernel frees it when this one ends
    forget_stale_run(out, identity, backend_state)
    write_provenance(out, cfg, HydraConfig.get().overrides.task)
    return writer
