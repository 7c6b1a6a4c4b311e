"""Task files of a data config: ``<data_dir>/tasks/<task>/{train,test}.jsonl`` (built-in tasks
are generated deterministically from the config's seed) and the rows a run trains on."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from cbpo.tasks import get_task

ROW_KEYS = ("id", "question", "answer", "domain")


def task_file(data_dir: str | Path, task: str, split: str) -> Path:
    return Path(data_dir) / "tasks" / task / f"{split}.jsonl"


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Atomic write: a crash leaves no partial file that looks finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def generate_task(task: str, data_dir: str | Path, seed: int, n_train: int, n_test: int) -> dict[str, Path]:
    splits = get_task(task).generate(seed, n_train, n_test)
    out = {}
    for split in ("train", "test"):
        out[split] = task_file(data_dir, task, split)
        write_jsonl(out[split], splits[split])
    return out


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a task file, each checked for the keys training needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no task file at {path} (run the data step first: python -m cbpo.prepare target=data)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: malformed row ({e.msg})") from None
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: row lacks {', '.join(missing)}")
        rows.append(row)
    return rows


def load_split(data_cfg: Mapping[str, Any], data_dir: str | Path, split: str) -> list[dict]:
    return [row for task in data_cfg["tasks"] for row in read_rows(task_file(data_dir, task, split))]
