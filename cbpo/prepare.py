"""Hydra entry for the cached preparation steps of the DAG.

    python -m cbpo.prepare target=data data=mix     # generate the built-in task files
    python -m cbpo.prepare target=model model=tiny   # build/convert the model checkpoint
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig

from cbpo.data import load_split
from cbpo.tasks import generate_task
from cbpo.schema import config_options, entry_point


def usage() -> str:
    return f"""python -m cbpo.prepare: the DAG's cached preparation steps.

  python -m cbpo.prepare target=data data=mix      # the built-in task files under data/tasks/
  python -m cbpo.prepare target=model model=tiny   # models/tiny (scratch model, or a converted checkpoint)

Settings people change: target=data|model   data=NAME   model=NAME   preset=NAME
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
    else:
        raise SystemExit(f"target must be 'data' or 'model', got {target!r} (add target=data or target=model)")


if __name__ == "__main__":
    main()
