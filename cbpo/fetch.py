"""The paper study's inputs from the Hugging Face hub: fetched once, resumably, each file
checksummed in a manifest, so that every later job runs offline.

An item is one input the DAG waits for (its ``target``):

- ``sft=DATA``: the data config's ``sft_upstream`` file (Tool-Star-SFT-54K's alpaca JSON) into
  ``<data root>/upstream/<repo name>/``, converted (``cbpo.toolstar``) into the config's ``sft`` file;
- ``benchmark=NAME``: a benchmark whose local file is missing, written there from its hub
  source with ``datasets`` (only where both sources read the same fields: MATH);
- ``model=NAME``: a hub model of ``cbpo.models.MODELS`` (the Qwen3 backbones, OPD's teacher)
  into ``<models dir>/NAME/`` with its ``cbpo_model.json`` card;
- ``corpus=wiki18``: Search-R1's wiki-18 passages (21M, ``wiki-18.jsonl.gz``) into
  ``<data root>/upstream/wiki-18-corpus/``, unpacked into ``<data root>/search/wiki-18.jsonl``
  for the retrieval server's index (``cbpo.retriever``).

A local copy put in place by hand (the upstream file, a downloaded model folder) is used as it is
and only checksummed. Before downloading anything the hub is asked about every item still to
download; if one cannot be reached, nothing is downloaded and one message lists every missing
item with the way to provide it by hand.

    python -m cbpo.fetch sft=toolstar-math benchmark=math model=qwen3-1.7b --data-root R --models-dir models
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from huggingface_hub import HfApi, hf_hub_download, snapshot_download

from cbpo.data import write_atomically

MANIFEST = "cbpo_manifest.json"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# What a model folder needs to load offline (weights, config, tokenizer, chat template).
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"]


class FetchError(RuntimeError):
    """Inputs that could not be had; the message lists each with how to provide it by hand."""


@dataclass(frozen=True)
class Item:
    name: str  # kind=name, as the command line takes it
    repo: str  # hub id
    repo_type: str  # dataset | model
    target: Path  # the file the DAG waits for
    local: Path  # what is downloaded: a file, or a model folder (with its config.json)
    manual: str  # how to provide it by hand

    def has_local_copy(self) -> bool:
        """The download is there (put in place by hand, or by an earlier attempt): use it as it is.
        An empty folder is not one (Snakemake makes its outputs' folders before the job runs)."""
        return self.local.is_file() or (self.local / "config.json").is_file()


def data_config(name: str) -> dict:
    path = CONFIGS / "data" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"data={name}: there is no {path}")
    return yaml.safe_load(path.read_text())


def sft_item(data: str, root: Path) -> Item | None:
    """The SFT traces of data config ``data``, where it names their upstream."""
    cfg = data_config(data)
    upstream = cfg.get("sft_upstream")
    if not upstream:
        return None
    target = Path(root) / cfg["files"]["sft"]
    local = Path(root) / "upstream" / upstream["repo"].split("/")[-1] / upstream["file"]
    return Item(f"sft={data}", upstream["repo"], "dataset", target, local,
                f"hf download {upstream['repo']} {upstream['file']} --repo-type dataset --local-dir {local.parent}"
                f" (or copy the file there); the fetch step then converts it into {target}")


def benchmark_item(name: str, root: Path) -> Item | None:
    """A benchmark's local file from its hub source, where the two read the same fields."""
    from eval.benchmarks import benchmark_config

    sources = benchmark_config(name)["sources"]
    local = next((s for s in sources if "path" in s and s.get("relative_to", "shared") == "shared"), None)
    hub = next((s for s in sources if "hub" in s), None)
    if local is None or hub is None or local["fields"] != hub["fields"]:
        return None
    target = Path(root) / local["path"]
    args = ", ".join(repr(a) for a in (hub["hub"], hub.get("config")) if a is not None)
    return Item(f"benchmark={name}", hub["hub"], "dataset", target, target,
                f"python -c \"import datasets; datasets.load_dataset({args}, split={hub.get('split', 'test')!r})"
                f".to_json({str(target)!r})\"")


def model_item(name: str, models_dir: Path, folder: Path | None = None) -> Item | None:
    """A hub model's folder (``models_dir / name`` unless ``folder``); None for the models the
    suite builds itself."""
    from cbpo.models import MODEL_CARD, model_spec

    spec = model_spec(name)
    if spec.kind != "hub":
        return None
    folder = Path(models_dir) / name if folder is None else Path(folder)
    return Item(f"model={name}", spec.source, "model", folder / MODEL_CARD, folder,
                f"hf download {spec.source} --local-dir {folder} (or copy a downloaded copy there); "
                "the fetch step then checksums it and writes its card")


CORPORA = {"wiki18": ("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "search/wiki-18.jsonl")}


def corpus_item(name: str, root: Path) -> Item | None:
    """A retrieval corpus from the hub (``CORPORA``); None for one the suite builds itself."""
    if name not in CORPORA:
        return None
    repo, file, target = CORPORA[name]
    local = Path(root) / "upstream" / repo.split("/")[-1] / file
    return Item(f"corpus={name}", repo, "dataset", Path(root) / target, local,
                f"hf download {repo} {file} --repo-type dataset --local-dir {local.parent} (about 14 GB unpacked; "
                f"or copy the file there); the fetch step then unpacks it into {Path(root) / target}")


def study_items(data: str, benchmarks: Iterable[str], models: Iterable[str], root: Path, models_dir: Path) -> list[Item]:
    """Every hub input of a study: its SFT traces, benchmarks and models (backbone, teacher)."""
    items = [sft_item(data, root), *(benchmark_item(b, root) for b in benchmarks),
             *(model_item(m, models_dir) for m in models)]
    return [i for i in items if i is not None]


def missing(items: Iterable[Item]) -> list[Item]:
    return [i for i in items if not i.target.is_file()]


def parse_item(text: str, root: Path, models_dir: Path) -> Item:
    kind, _, name = text.partition("=")
    make = {"sft": lambda: sft_item(name, root), "benchmark": lambda: benchmark_item(name, root),
            "model": lambda: model_item(name, models_dir), "corpus": lambda: corpus_item(name, root)}
    if kind not in make or not name:
        raise ValueError(f"{text!r}: expected sft=DATA, benchmark=NAME, model=NAME or corpus=NAME")
    item = make[kind]()
    if item is None:
        raise ValueError(f"{text!r}: nothing to fetch (no hub source the suite can read for it)")
    return item


# --------------------------------------------------------------------------- manifests

def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listed(folder: Path) -> list[Path]:
    # huggingface_hub keeps its download state in <local_dir>/.cache: not part of the input
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST
                  and ".cache" not in p.relative_to(folder).parts)


def write_manifest(folder: Path, source: Mapping[str, Any], files: Iterable[Path] | None = None) -> dict:
    """``folder/cbpo_manifest.json``: where the files came from and each one's size and sha256."""
    files = _listed(folder) if files is None else list(files)
    manifest = {"source": dict(source), "fetched_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files}}
    write_atomically(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify(folder: Path) -> list[str]:
    """What differs from ``folder``'s manifest (a missing, resized or changed file); [] if all match."""
    manifest = json.loads((folder / MANIFEST).read_text())
    problems = []
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != entry["bytes"] or sha256(path) != entry["sha256"]:
            problems.append(f"{path}: differs from its manifest (sha256 {entry['sha256'][:12]}...)")
    return problems


# --------------------------------------------------------------------------- fetching

def _revision(item: Item) -> str:
    """The hub commit an item is fetched at; raises (offline, unknown id) when it cannot be asked."""
    return HfApi().repo_info(item.repo, repo_type=item.repo_type, timeout=20).sha


def fetch(items: Iterable[Item]) -> list[Item]:
    """Fetch every item whose target is missing; returns those fetched. Nothing is downloaded
    unless the hub answers for every item that has no local copy."""
    todo = missing(items)
    to_download = [i for i in todo if not i.has_local_copy()]
    revisions, unreachable = {}, []
    for item in to_download:
        try:
            revisions[item.name] = _revision(item)
        except Exception as err:  # offline, no network, unknown or gated repository: say which
            unreachable.append(f"- {item.name} ({item.repo}) -> {item.target}\n    {type(err).__name__}: "
                               f"{str(err).splitlines()[0] if str(err) else ''}\n    by hand: {item.manual}")
    if unreachable:
        others = [f"- {i.name} -> {i.target} (a local copy is there: it will be used)" for i in todo if i.has_local_copy()]
        raise FetchError(f"{len(unreachable)} input(s) of the study cannot be fetched from the hub "
                         f"({os.environ.get('HF_ENDPOINT', 'https://huggingface.co')}); nothing was downloaded:\n"
                         + "\n".join(unreachable + others)
                         + "\nProvide each by hand as shown (on a machine with the hub), then run the study again.")
    for item in todo:
        kind = item.name.partition("=")[0]
        {"sft": _fetch_sft, "benchmark": _fetch_benchmark, "model": _fetch_model, "corpus": _fetch_corpus}[kind](item, revisions.get(item.name))
        print(f"{item.name}: {item.target}", flush=True)
    return todo


def _fetch_sft(item: Item, revision: str | None) -> None:
    from cbpo.toolstar import convert_file

    folder = item.local.parent
    if not item.has_local_copy():
        # hf_hub_download resumes a partial file kept in <local_dir>/.cache across attempts
        hf_hub_download(item.repo, item.local.name, repo_type="dataset", revision=revision, local_dir=folder)
    _record(folder, item, revision, [item.local])
    result = convert_file(item.local, item.target)
    print(f"{item.target}: {len(result.rows)} traces, {len(result.rejected)} rejected "
          f"(named in {item.target.with_name(item.target.stem + '.report.json')})", flush=True)


def _fetch_benchmark(item: Item, revision: str | None) -> None:
    import datasets

    from eval.benchmarks import benchmark_config

    hub = next(s for s in benchmark_config(item.name.partition("=")[2])["sources"] if "hub" in s)
    rows = datasets.load_dataset(hub["hub"], hub.get("config"), split=hub.get("split", "test"), revision=revision)
    item.target.parent.mkdir(parents=True, exist_ok=True)
    tmp = item.target.with_name(f".{item.target.name}.tmp")
    rows.to_json(str(tmp), lines=True, force_ascii=False)
    os.replace(tmp, item.target)
    write_manifest(item.target.parent, {"repo": item.repo, "repo_type": "dataset", "revision": revision,
                                        "split": hub.get("split", "test")}, [item.target])


def _fetch_corpus(item: Item, revision: str | None) -> None:
    import gzip
    import shutil

    if not item.has_local_copy():
        hf_hub_download(item.repo, item.local.name, repo_type="dataset", revision=revision, local_dir=item.local.parent)
    _record(item.local.parent, item, revision, [item.local])
    item.target.parent.mkdir(parents=True, exist_ok=True)
    partial = item.target.with_name(f".{item.target.name}.partial")
    with gzip.open(item.local, "rb") as packed, partial.open("wb") as out:
        shutil.copyfileobj(packed, out, 1 << 24)
    os.replace(partial, item.target)


def _fetch_model(item: Item, revision: str | None) -> None:
    from cbpo.models import MODEL_CARD, model_spec

    folder = item.local
    if not item.has_local_copy():
        # a partial folder survives a failed attempt, and snapshot_download resumes into it
        partial = folder.with_name(f".{folder.name}.partial")
        snapshot_download(item.repo, repo_type="model", revision=revision, local_dir=partial, allow_patterns=MODEL_FILES)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        os.replace(partial, folder)
    if not (folder / "config.json").is_file():
        raise FetchError(f"{folder} holds no config.json: not a model folder ({item.manual})")
    _record(folder, item, revision)
    name = item.name.partition("=")[2]
    spec = model_spec(name)
    card = {"name": name, "kind": spec.kind, "description": spec.description, "hub_id": spec.source, "revision": revision}
    write_atomically(folder / MODEL_CARD, json.dumps(card, indent=2) + "\n")  # last: the DAG's target


def _record(folder: Path, item: Item, revision: str | None, files: list[Path] | None = None) -> None:
    """Checksum what was fetched; a copy that no longer matches an earlier manifest is refused."""
    if (folder / MANIFEST).is_file():
        problems = verify(folder)
        if problems:
            raise FetchError(f"{item.name}: {folder} does not match its manifest:\n  " + "\n  ".join(problems)
                             + f"\nremove it (or the changed files) and fetch again: {item.manual}")
        return
    source = {"repo": item.repo, "repo_type": item.repo_type, "revision": revision or "local copy"}
    write_manifest(folder, source, files)


def main(argv: list[str] | None = None) -> int:
    from cbpo.data import shared_data_dir

    parser = argparse.ArgumentParser(prog="python -m cbpo.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", help="sft=DATA, benchmark=NAME, model=NAME or corpus=wiki18")
    parser.add_argument("--data-root", default=None, help="default: $CBPO_SHARED_DATA, else ../shared/data")
    parser.add_argument("--models-dir", default="models")
    args = parser.parse_args(argv)
    root, models_dir = shared_data_dir(args.data_root), Path(args.models_dir)
    try:
        fetch([parse_item(text, root, models_dir) for text in args.items])
    except (FetchError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
