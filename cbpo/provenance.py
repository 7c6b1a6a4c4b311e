"""Where a result folder came from: ``provenance.json`` beside a run's checkpoints or an
evaluation's summary, with the composed config, the command line's overrides, the package
versions, the code's git commit, the host and the time.

Bookkeeping only: nothing reads it back to decide what to resume (``run_key.json`` and
``identity.json`` do), so a new commit or host never retrains or regenerates anything.
"""
from __future__ import annotations

import json
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from cbpo.data import write_atomically

PROVENANCE = "provenance.json"
# The GPU stack is recorded where installed; it is looked up, never imported (vLLM's import
# alone takes seconds and may initialise CUDA).
PACKAGES = ("torch", "transformers", "hydra-core", "omegaconf", "numpy", "vllm", "verl")
CODE = Path(__file__).resolve().parent


def versions() -> dict[str, str]:
    """Python's version and each installed package's of ``PACKAGES``."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(directory: str | Path = CODE) -> dict[str, Any]:
    """The commit checked out at ``directory`` and whether the working tree differs from it;
    both None outside a git checkout or without git."""
    commit = _git(Path(directory), "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git(Path(directory), "status", "--porcelain")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def search_index(cfg: DictConfig) -> dict[str, Any] | None:
    """The retrieval index a run searches through the suite's server (``search_options.index``):
    its name, kind, size and corpus hash; None otherwise."""
    from cbpo.retriever.index import read_meta

    index = (OmegaConf.select(cfg, "tools_cfg.search_options") or {}).get("index")
    if OmegaConf.select(cfg, "tools_cfg.search_backend") != "http" or not index:
        return None
    meta = read_meta(index)
    return {"folder": str(Path(index).resolve()), **{k: meta.get(k) for k in ("name", "kind", "size", "corpus_sha")}}


def write_provenance(folder: str | Path, cfg: DictConfig, overrides: Sequence[str]) -> Path:
    """Write ``<folder>/provenance.json`` atomically and return its path."""
    path = Path(folder) / PROVENANCE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "overrides": list(overrides),
        "versions": versions(),
        "git": git_state(),
        "host": socket.gethostname(),
        "search_index": search_index(cfg),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_atomically(path, json.dumps(record, indent=1) + "\n")
    return path


def read_git(folder: str | Path) -> dict[str, Any] | None:
    """The git state a folder's provenance records; None where it has none."""
    path = Path(folder) / PROVENANCE
    return json.loads(path.read_text()).get("git") if path.is_file() else None
