"""The rows a run trains on. A data config either names built-in tasks (``tasks``: files
``<data_dir>/tasks/<task>/{train,test}.jsonl``, generated deterministically from the config's
seed) or data files under the data root (``files``: Tool-Star's RL mix, read with ``datasets``,
filtered to the config's ``abilities``). The JSONL reader and field checks here are also the
benchmark loader's (``eval.benchmarks``)."""
from __future__ import annotations

import ast
import json
import math
import os
from contextlib import nullcontext
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

DOMAINS = ("math", "search")


def task_file(data_dir: str | Path, task: str, split: str) -> Path:
    return Path(data_dir) / "tasks" / task / f"{split}.jsonl"


def write_atomically(path: Path, text: str) -> None:
    """A crash leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Atomic write: a crash leaves no partial file that looks finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | Path, stream: IO[bytes] | None = None) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` for every non-blank line of a JSONL file, ``where`` being ``file:line``;
    ``stream`` is read instead of opening ``path`` (stdin). A line that is not UTF-8, not JSON
    or not a JSON object raises ValueError naming it."""
    with open(path, "rb") if stream is None else nullcontext(stream) as lines:
        for n, raw in enumerate(lines, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at offset {e.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:  # also a number past Python's 4300-digit limit
                raise ValueError(f"{where}: not valid JSON ({e})") from None
            except RecursionError:
                raise ValueError(f"{where}: JSON nested too deeply") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def read_appended(path: str | Path, what: str) -> tuple[list[tuple[int, Any]], int]:
    """The records of an append-only JSONL file (a run's metrics, an evaluation's samples) as
    (line number, value), and the length in bytes of the lines that hold them. Each record is one
    write ending in a newline, so the text after the last newline, or a last line that is not
    JSON, is a write torn by a kill or a full disk: it is left out (the caller cuts it off). A bad
    line before the last is damage this cannot explain: an error naming the line and ``what``."""
    body, newline, _ = Path(path).read_bytes().rpartition(b"\n")
    lines = body.split(b"\n") if newline else []
    records: list[tuple[int, Any]] = []
    size = offset = 0
    for lineno, line in enumerate(lines, 1):
        offset += len(line) + 1
        if line.strip():
            try:
                records.append((lineno, json.loads(line)))
            except ValueError:
                if lineno == len(lines):
                    break
                raise ValueError(f"{path}:{lineno}: corrupt {what} (not JSON)") from None
        size = offset
    return records, size


def _field(row: Mapping[str, Any], key: str, where: str, label: str | None) -> tuple[Any, str]:
    name = f"{label} field {key!r}" if label else f"field {key!r}"
    if key not in row:
        raise ValueError(f"{where}: {name} is missing")
    return row[key], name


def text_field(row: Mapping[str, Any], key: str, where: str, label: str | None = None) -> str:
    """``row[key]`` as a non-blank string; otherwise ValueError naming the line and field."""
    value, name = _field(row, key, where, label)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {name} is a {type(value).__name__}, not a string")
    if not value.strip():
        raise ValueError(f"{where}: {name} is empty")
    return value


def id_field(row: Mapping[str, Any], key: str, where: str, label: str | None = None) -> str:
    """A row id: an integer or a non-blank string, as a string."""
    value, name = _field(row, key, where, label)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {name} is a {type(value).__name__}, not an int or string")
    return text_field(row, key, where, label)


def _gold(value: Any, name: str, where: str) -> str:
    # Numeric golds (AIME's integers) are compared as text by the verifiers.
    number = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)
    if not (number or isinstance(value, str)):
        raise ValueError(f"{where}: {name} is {value!r:.40}, not a number, string or list of them")
    text = str(value).strip()
    if not text:
        raise ValueError(f"{where}: {name} is empty")
    return text


def answer_field(row: Mapping[str, Any], key: str, where: str, label: str | None = None) -> str | list[str]:
    """A gold answer: a number or string, or a non-empty list of them (aliases), as text."""
    value, name = _field(row, key, where, label)
    if isinstance(value, list):
        if not value:
            raise ValueError(f"{where}: {name} is an empty list")
        return [_gold(v, name, where) for v in value]
    return _gold(value, name, where)


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a task file (format: ``cbpo.tasks``), each checked for the fields training reads."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no task file at {path} (run the data step first: python -m cbpo.prepare target=data)")
    rows = []
    for where, row in read_jsonl(path):
        domain, name = _field(row, "domain", where, None)
        if domain not in DOMAINS:
            raise ValueError(f"{where}: {name} must be one of {DOMAINS}, got {domain!r}")
        rows.append({
            **row,
            "id": id_field(row, "id", where),
            "question": text_field(row, "question", where),
            "answer": answer_field(row, "answer", where),
            "trace": text_field(row, "trace", where),
        })
    return rows


def shared_data_dir(setting: str | Path | None = None) -> Path:
    """The data root: ``setting`` (the ``data_root`` config key) if given, else
    ``$CBPO_SHARED_DATA``, else ``../shared/data`` next to the repository."""
    if setting:
        return Path(setting)
    env = os.environ.get("CBPO_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


# Tool-Star's `ability` column -> the reward's domain.
ABILITY_DOMAINS = {"math": "math", "qa": "search"}


def data_files(data_cfg: Mapping[str, Any], split: str) -> list[Path]:
    """The files under the data root that ``split`` of a ``files`` data config reads."""
    if "files" not in data_cfg:
        return []
    files = data_cfg["files"]
    if split not in files:
        raise KeyError(f"data {data_cfg['name']!r} has no {split!r} file (it has {', '.join(files)})")
    return [shared_data_dir(data_cfg.get("root")) / files[split]]


def _literal(value: Any) -> Any:
    # Tool-Star stores reward_model as a Python-literal string ("{'ground_truth': ...}").
    return ast.literal_eval(value) if isinstance(value, str) else value


def read_toolstar(path: Path, abilities: Iterable[str]) -> list[dict]:
    """RL rows (``id``, ``question``, ``answer``, ``domain``) of a Tool-Star parquet/JSON(L)
    file, those of the given ``abilities`` (``math``, ``qa``) that have a gold answer, in file
    order; ``id`` is the row's position in the file."""
    if not path.is_file():
        raise FileNotFoundError(f"no training data at {path} (set data_root=... or $CBPO_SHARED_DATA)")
    import datasets

    kind = "parquet" if path.suffix == ".parquet" else "json"
    table = datasets.load_dataset(kind, data_files=str(path), split="train")
    wanted = set(abilities)
    unknown = wanted - set(ABILITY_DOMAINS)
    if unknown:
        raise ValueError(f"unknown abilities {sorted(unknown)}; Tool-Star has {sorted(ABILITY_DOMAINS)}")
    rows = []
    for n, record in enumerate(table):
        if record.get("ability") not in wanted:
            continue
        where = f"{path} row {n}"
        reward = _literal(record.get("reward_model"))
        if not isinstance(reward, dict):
            raise ValueError(f"{where}: reward_model is {reward!r:.80}, not a mapping with ground_truth")
        if str(reward.get("ground_truth", "")).strip() == "":
            continue  # nothing to reward against (one construction problem in Tool-Star's math half)
        rows.append({
            "id": str(n),
            "question": text_field(record, "question", where),
            "answer": answer_field(reward, "ground_truth", where, "reward_model"),
            "domain": ABILITY_DOMAINS[record["ability"]],
        })
    if not rows:
        raise ValueError(f"{path}: no rows with ability in {sorted(wanted)}")
    return rows


def load_split(data_cfg: Mapping[str, Any], data_dir: str | Path, split: str) -> list[dict]:
    """``split`` (train | test | sft) of a data config. Built-in tasks' SFT traces are their
    train rows; a ``files`` config's ``sft`` file holds traces in the task format."""
    if "files" in data_cfg:
        (path,) = data_files(data_cfg, split)
        return read_rows(path) if split == "sft" else read_toolstar(path, data_cfg["abilities"])
    split = "train" if split == "sft" else split
    return [row for task in data_cfg["tasks"] for row in read_rows(task_file(data_dir, task, split))]
