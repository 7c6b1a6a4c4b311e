"""Hydra entry for the cached preparation steps of the DAG.

    python -m cbpo.prepare target=data data=mix     # generate the built-in task files
    python -m cbpo.prepare target=model model=tiny   # build/convert the model checkpoint
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cbpo.data import generate_task, load_split
from cbpo.schema import config_options, entry_point


def usage() -> str:
    return f"""python -m cbpo.prepare: the DAG's cached preparation steps.

  python -m cbpo.prepare target=data data=mix      # the built-in task files under data/tasks/
  python -m cbpo.prepare target=model model=tiny   # models/tiny (scratch model, or a converted checkpoint)

Settings people change: target=data|model   data=NAME   model=NAME   preset=NAME
data: {', '.join(config_options('data'))}
models: {', '.join(config_options('model'))}
"""


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
        from cbpo.models import prepare_model

        from cbpo.chat import SYSTEM_PROMPT

        # Scratch tokenizers learn from every built-in task's text, whatever the run's data;
        # the system prompt is in every rollout, so it is weighted to merge into few tokens.
        texts = [SYSTEM_PROMPT] * 500
        for task in ("arith", "twohop"):
            for row in load_split({"tasks": [task]}, data_dir, "train"):
                texts += [row["question"], row["trace"]]
        out = prepare_model(cfg.model.name, Path(cfg.paths.models_dir) / cfg.model.name, corpus_texts=texts, seed=cfg.seed)
        print(f"model {cfg.model.name}: {out}")
    else:
        raise SystemExit(f"target must be 'data' or 'model', got {target!r} (add target=data or target=model)")


if __name__ == "__main__":
    main()
