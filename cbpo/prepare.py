"""Hydra entry for the cached preparation steps of the DAG.

    python -m cbpo.prepare target=data data=mix     # generate the built-in task files
    python -m cbpo.prepare target=model model=tiny   # build/convert the model checkpoint
    python -m cbpo.prepare target=corpus             # the retrieval server's small corpus
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from omegaconf import DictConfig

from cbpo.data import load_split
from cbpo.tasks import generate_task
from cbpo.schema import config_options, entry_point


def usage() -> str:
    return f"""python -m cbpo.prepare: the DAG's cached preparation steps.

  python -m cbpo.prepare target=data data=mix      # the built-in task files under data/tasks/
  python -m cbpo.prepare target=model model=tiny   # models/tiny (scratch model, or a converted checkpoint)
  python -m cbpo.prepare target=corpus             # data/retriever/small.jsonl (docs/retriever.md)

Settings people change: target=data|model|corpus   data=NAME   model=NAME   preset=NAME
data: {', '.join(config_options('data'))}
models: {', '.join(config_options('model'))}
"""


def model_folder(name: str, out_dir: Path, corpus_texts: Iterable[str] | None = None, seed: int = 0) -> Path:
    """Model ``name`` in ``out_dir``: a hub model fetched there (``cbpo.fetch``: once,
    resumably, checksummed), any other built or converted (``cbpo.models.prepare_model``)."""
    from cbpo.fetch import fetch, model_item
    from cbpo.models import model_spec, prepare_model

    if model_spec(name).kind == "hub":
        fetch([model_item(name, out_dir.parent, folder=out_dir)])
        return out_dir
    return prepare_model(name, out_dir, corpus_texts, seed)


def small_corpus(seed: int, data_root: str | Path | None) -> Iterator[dict]:
    """The retrieval server's corpus for CI and the demo: the built-in two-hop world of ``seed``
    (what search reads without a backend) and, where the data root has it, every page of ARPO's
    search cache (real web snippets; one passage per distinct page)."""
    import hashlib
    import json

    from cbpo.data import shared_data_dir
    from cbpo.tasks.twohop import corpus
    from cbpo.tools import ARPO_SEED
    from cbpo.tools.search import parse_observation

    yield from corpus(seed)
    cache = shared_data_dir(data_root) / ARPO_SEED
    if not cache.is_file():
        return
    seen = set()
    for observation in json.loads(cache.read_text(encoding="utf-8")).values():
        for page in parse_observation(observation):
            key = hashlib.sha256(page["text"].encode("utf-8")).hexdigest()[:16]
            if page["text"] and key not in seen:
                seen.add(key)
                yield {"id": f"arpo-{key}", "title": "", "text": page["text"]}


@entry_point(usage=usage)
def main(cfg: DictConfig) -> None:
    target = cfg.get("target")
    data_dir = Path(cfg.paths.data_dir)
    if target == "data":
        for task in cfg.data.tasks:
            paths = generate_task(task, data_dir, cfg.data.seed, cfg.data.n_train, cfg.data.n_test,
                                  **cfg.data.get("task_options", {}))
            print(f"{task}: {paths['train']} {paths['test']}")
    elif target == "model":
        from cbpo.chat import SYSTEM_PROMPT

        # Scratch tokenizers learn from every built-in task's text, whatever the run's data;
        # the system prompt is in every rollout, so it is weighted to merge into few tokens.
        texts = [SYSTEM_PROMPT] * 500
        for task in ("arith", "twohop"):
            for row in load_split({"tasks": [task]}, data_dir, "train"):
                texts += [row["question"], row["trace"]]
        out = model_folder(cfg.model.name, Path(cfg.paths.models_dir) / cfg.model.name, corpus_texts=texts, seed=cfg.seed)
        print(f"model {cfg.model.name}: {out}")
    elif target == "corpus":
        import json

        from cbpo.data import write_atomically

        out = data_dir / "retriever" / "small.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        passages = list(small_corpus(cfg.data.seed, cfg.data_root))
        write_atomically(out, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in passages))
        print(f"corpus small: {len(passages)} passages -> {out}")
    else:
        raise SystemExit(f"target must be 'data', 'model' or 'corpus', got {target!r} (add target=data, target=model or target=corpus)")


if __name__ == "__main__":
    main()
