"""Benchmarks as configuration: one YAML file per benchmark in ``eval/benchmarks/``, read by
one loader (paper Sec. 5.1: five math and five search benchmarks, plus the built-in tasks).

A config names the benchmark, its Table 1 column (``display_name``), its ``domain`` (math |
search), its ``metric`` (math | f1 | em | judge) and an ordered list of ``sources``; the first
usable source is read. A source is a local JSONL file (``path``, relative to the shared data dir
or, with ``relative_to: tasks``, to the suite's generated task data, ``paths.data_dir``) or a dataset-hub id (``hub`` with
optional ``config``/``split``, read with ``datasets`` for machines with a network), each with
its own field mapping:

    fields:
      question: problem        # field holding the question text
      answer: answer           # int, str or list of aliases
      id: id                   # optional; otherwise the row's position
      answer_after: "####"     # optional: keep the text after the last marker (GSM8K)
      answer_from: boxed       # optional: keep the last \\boxed{} of the field (MATH solutions)

Rows come out as ``{"id", "question", "answer": str | list[str], "domain", "metric"}``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cbpo.data import DOMAINS, answer_field, id_field, read_jsonl, shared_data_dir, text_field
from eval.verifiers.extract import last_boxed
from eval.verifiers.scoring import METRICS, Scorer, make_scorer

CONFIG_DIR = Path(__file__).with_name("benchmarks")
_CONFIG_KEYS = {"name", "display_name", "domain", "metric", "sources", "judge", "description"}
_SOURCE_KEYS = {"path", "relative_to", "hub", "config", "split", "fields"}
_FIELD_KEYS = {"question", "answer", "id", "answer_after", "answer_from"}

def list_benchmarks() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def benchmark_config(name: str) -> dict[str, Any]:
    """The validated config of benchmark ``name``."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(list_benchmarks())}")
    config = yaml.safe_load(path.read_text())
    _validate(config, path)
    return config


def scorer_for(benchmark: str, fallback: str | None = None, workers: int = 2, timeout: float = 5.0) -> Scorer:
    """The scorer a benchmark's config asks for (its metric; a judge with the config's block)."""
    config = benchmark_config(benchmark)
    return make_scorer(config["metric"], config.get("judge"), fallback=fallback, workers=workers, timeout=timeout)


def load_benchmark(
    name: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    path: str | Path | None = None,
    tasks_dir: str | Path = "data",
) -> list[dict[str, Any]]:
    """The rows of benchmark ``name`` from its first usable source.

    ``data_dir`` replaces the shared data dir, ``tasks_dir`` is where the data step wrote the
    built-in tasks (``paths.data_dir``); ``path`` replaces the source file altogether
    (same field mapping as the config's first local source). A malformed row raises
    ValueError naming the file and line."""
    config = benchmark_config(name)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if path is not None:
        source = next((s for s in config["sources"] if "path" in s), config["sources"][0])
        if not Path(path).is_file():
            raise FileNotFoundError(f"benchmark file {path} does not exist")
        return _normalise(read_jsonl(path), source["fields"], config, limit)
    failures = []
    for source in config["sources"]:
        if "path" in source:
            base = Path(tasks_dir) if source.get("relative_to") == "tasks" else Path(data_dir or shared_data_dir())
            file = base / source["path"]
            if file.is_file():
                return _normalise(read_jsonl(file), source["fields"], config, limit)
            failures.append(f"{file} does not exist")
        else:
            try:
                records = _read_hub(source)
            except Exception as err:  # offline, missing `datasets`, unknown id: say which
                failures.append(f"hub {source['hub']!r}: {type(err).__name__}: {err}")
                continue
            return _normalise(records, source["fields"], config, limit)
    raise FileNotFoundError(f"benchmark {name!r} has no usable source: " + "; ".join(failures))


def planned_file(name: str, data_dir: str | Path | None = None, tasks_dir: str | Path = "data",
                 offline: bool = True) -> Path | None:
    """The file an evaluation of ``name`` will read, so that the DAG can wait for it or fail at
    planning naming it. Sources in order, as ``load_benchmark`` tries them: a local file that
    exists (a ``relative_to: tasks`` file is the data step's output, so it counts), or None for
    a hub source when not ``offline``; with neither, the first local source's missing path."""
    first_missing = None
    for source in benchmark_config(name)["sources"]:
        if "hub" in source:
            if not offline:
                return None
            continue
        if source.get("relative_to") == "tasks":
            return Path(tasks_dir) / source["path"]
        file = Path(data_dir or shared_data_dir()) / source["path"]
        if file.is_file():
            return file
        first_missing = first_missing or file
    if first_missing is None:  # hub-only and offline
        hubs = ", ".join(s["hub"] for s in benchmark_config(name)["sources"])
        raise FileNotFoundError(f"benchmark {name!r} is only on the hub ({hubs}) and the hub is offline")
    return first_missing


Record = tuple[str, dict]  # (where, e.g. "file.jsonl:12", the row)


def _read_hub(source: dict[str, Any]) -> list[Record]:
    import datasets  # optional: only GPU/network users reach this

    split = source.get("split", "test")
    data = datasets.load_dataset(source["hub"], source.get("config"), split=split)
    return [(f"hub:{source['hub']}[{split}] row {i}", dict(row)) for i, row in enumerate(data)]


def _normalise(records, fields: dict[str, str], config: dict[str, Any], limit: int | None) -> list[dict]:
    rows: list[dict] = []
    seen: dict[str, str] = {}
    for where, record in records:
        if limit is not None and len(rows) >= limit:
            break
        row_id = _row_id(record, fields, len(rows), where)
        if row_id in seen:
            raise ValueError(f"{where}: duplicate id {row_id!r} (first at {seen[row_id]})")
        seen[row_id] = where
        rows.append({
            "id": row_id,
            "question": text_field(record, fields["question"], where, "question"),
            "answer": _answer(record, fields, where),
            "domain": config["domain"],
            "metric": config["metric"],
        })
    return rows


def _row_id(record: dict, fields: dict[str, str], position: int, where: str) -> str:
    key = fields.get("id")
    return str(position) if key is None else id_field(record, key, where, "id")


def _answer(record: dict, fields: dict[str, str], where: str) -> str | list[str]:
    key = fields["answer"]
    answer = answer_field(record, key, where, "answer")
    if isinstance(answer, list):
        return answer
    marker = fields.get("answer_after")
    if marker is not None:
        if marker not in answer:
            raise ValueError(f"{where}: answer field {key!r} has no {marker!r} marker")
        answer = answer.rsplit(marker, 1)[1].strip()
    if fields.get("answer_from") == "boxed":
        boxed = last_boxed(answer)
        if boxed is None:
            raise ValueError(f"{where}: answer field {key!r} has no \\boxed{{}} answer")
        answer = boxed
    if not answer:
        raise ValueError(f"{where}: answer field {key!r} is empty")
    return answer


def _validate(config: Any, path: Path) -> None:
    def bad(problem: str) -> ValueError:
        return ValueError(f"benchmark config {path}: {problem}")

    if not isinstance(config, dict):
        raise bad("not a mapping")
    missing = {"name", "display_name", "domain", "metric", "sources"} - set(config)
    if missing:
        raise bad(f"missing keys {sorted(missing)}")
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}")
    if config["name"] != path.stem:
        raise bad(f"name {config['name']!r} differs from the file name {path.stem!r}")
    if config["domain"] not in DOMAINS:
        raise bad(f"domain {config['domain']!r} not one of {DOMAINS}")
    if config["metric"] not in METRICS:
        raise bad(f"metric {config['metric']!r} not one of {METRICS}")
    if config["metric"] == "judge" and not isinstance(config.get("judge"), dict):
        raise bad("metric 'judge' needs a `judge:` block (model, prompt)")
    sources = config["sources"]
    if not isinstance(sources, list) or not sources:
        raise bad("`sources` must be a non-empty list")
    for i, source in enumerate(sources):
        if not isinstance(source, dict) or ("path" in source) == ("hub" in source):
            raise bad(f"source {i} needs exactly one of `path` or `hub`")
        if set(source) - _SOURCE_KEYS:
            raise bad(f"source {i} has unknown keys {sorted(set(source) - _SOURCE_KEYS)}")
        if source.get("relative_to", "shared") not in ("shared", "tasks"):
            raise bad(f"source {i}: relative_to must be 'shared' or 'tasks'")
        fields = source.get("fields")
        if not isinstance(fields, dict) or not {"question", "answer"} <= set(fields):
            raise bad(f"source {i} needs `fields` with at least `question` and `answer`")
        if set(fields) - _FIELD_KEYS:
            raise bad(f"source {i} has unknown field keys {sorted(set(fields) - _FIELD_KEYS)}")
        if fields.get("answer_from", "boxed") != "boxed":
            raise bad(f"source {i}: answer_from supports only 'boxed'")
