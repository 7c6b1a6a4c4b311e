"""``python -m cbpo.train backend=verl ...``: the RL stage on verl. On GPUs it is verl as
released; on a machine without one it runs the same processes on CPUs through ``cpu.py`` (the
engine environment, ``make engines``, has vLLM's CPU build). Without vLLM or Ray it stops before
writing anything, naming what is missing, rather than fall back to another trainer.
``verl.dry_run=true`` prints the generated verl config, validated by verl itself, on any machine.

The launch keeps the local backend's run folder (one writer, ``run_key.json``, provenance),
writes what verl's processes read (``verl/``: the rows as verl's dataset, the run's config, the
agent-loop registration) and hands the config to verl's own ``run_ppo`` (``ray.init`` with its
runtime env, then a task runner) with the suite's task runner (``trainer.py``).
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from cbpo.backends.verl import config as verl_config
from cbpo.schema import method_config, settings


CPU_MODULE = "cbpo.backends.verl.cpu"


def missing_engines() -> list[str]:
    """What this environment lacks for verl's trainer (empty when it can run)."""
    return [f"{m} is not installed" for m in ("vllm", "ray") if importlib.util.find_spec(m) is None]


def on_cpu() -> bool:
    """No CUDA GPU: verl runs through the CPU platform (cpu.py)."""
    return not torch.cuda.is_available()


def unsupported(method) -> str | None:
    """Why the verl backend cannot train ``method``; None when it can."""
    # A setup hook gives a method models for its own steps. verl does that work for the methods
    # that declare it (registry.register_method): a distilled method's teacher is verl's
    # distillation, an off-context method's rescoring is verl's actor; a method with another
    # setup would miss what it asks for.
    if hasattr(method, "setup") and not (method.distilled or method.off_context_credit):
        return "needs the policy model in its own steps, which verl keeps in its workers"
    return None


def run_verl(cfg: DictConfig, out: Path) -> None:
    out = Path(out).absolute()  # verl's workers on other nodes do not share this process's directory
    # the suite's own extensions of verl (a method's policy loss, the CPU platform): verl imports
    # these modules in every process that imports it (VERL_USE_EXTERNAL_MODULES), Ray's workers
    # on every node included
    loss_module = method_config(cfg).objective().policy_loss_module
    modules = ",".join([*([loss_module] if loss_module else []), *([CPU_MODULE] if on_cpu() else [])])
    os.environ["VERL_USE_EXTERNAL_MODULES"] = modules  # before verl's first import, below
    if on_cpu():
        from cbpo.backends.verl import cpu

        cpu.activate()  # before verl's first import (the config check below): verl loads cpu.py then
    verl_cfg = settings(cfg, "verl")
    if cfg.stage == "sft":
        from cbpo.backends.verl import sft

        return sft.launch(cfg, out, verl_cfg, on_cpu(), dict(os.environ))
    generated = verl_config.build(cfg, method_config(cfg), settings(cfg, "rl"), verl_cfg,
                                  str(out / "verl" / "train.parquet"), out)
    if on_cpu():
        # free-form in verl: model.override_config; enable_sleep_mode is a field of verl's rollout
        # dataclass that its YAML does not list
        teacher = bool(generated.distillation.enabled)
        nodes = [generated.actor_rollout_ref.model.override_config, generated.actor_rollout_ref.rollout]
        if teacher:
            nodes.append(generated.distillation.teacher_models.teacher_model.inference)
        for node in nodes:
            OmegaConf.set_struct(node, False)
        separate = not generated.actor_rollout_ref.hybrid_engine  # rl.async_training
        generated = OmegaConf.merge(generated, cpu_overrides(cfg, teacher, separate))
    runtime_env = generated.ray_kwargs.ray_init.runtime_env
    OmegaConf.set_struct(runtime_env, False)
    # for Ray's workers, which inherit this process's environment only where this process starts
    # Ray: a cluster started beforehand (slurm/ray-on-slurm.sh) passes them this alone
    runtime_env.env_vars = {"VERL_USE_EXTERNAL_MODULES": modules, **(cpu.ENV if on_cpu() else {})}
    if verl_cfg.dry_run:
        print(OmegaConf.to_yaml(generated))
        return
    from cbpo.registry import build_method

    why = unsupported(build_method(cfg, vocab_size=None))
    if why:
        raise ValueError(f"method={cfg.method.name} {why}; train it with backend=local")
    lacks = missing_engines()
    if lacks:
        raise RuntimeError(f"backend=verl needs the engine environment (environment.yml on GPUs; `make engines` "
                           f"builds .venv-engines on a CPU machine): {'; '.join(lacks)}. "
                           "Use backend=local, or verl.dry_run=true to check the generated config")
    from cbpo.data import load_split
    from cbpo.runs import claim_run

    rows = load_split(cfg.data, cfg.paths.data_dir, "train")
    writer = claim_run(cfg, out, rows, cfg.init, backend_state=["verl"])  # verl resumes any checkpoint there
    if writer is None:
        return
    with writer:
        fit_prompt_length(generated, cfg, rows)
        write_inputs(cfg, generated, rows)
        if on_cpu():
            cpu.init_ray(generated)
        from verl.trainer.main_ppo import run_ppo

        from cbpo.backends.verl.trainer import SuiteTaskRunner

        run_ppo(generated, task_runner_class=SuiteTaskRunner)
    print(f"wrote {out / 'final'}")


def fit_prompt_length(generated: DictConfig, cfg: DictConfig, rows) -> None:
    """verl's prompt block as wide as the longest training prompt. verl's own agent loops
    left-truncate a longer prompt, which would cut the system prompt or the question and train on
    a problem the local backend never sees; the suite's agent loop refuses one instead
    (``trainer.GroupAgentLoop``), so the width is set from the rows themselves."""
    from transformers import AutoTokenizer

    from cbpo.chat import build_prompt, resolve_system_prompt

    tokenizer = AutoTokenizer.from_pretrained(cfg.init)
    system_prompt = resolve_system_prompt(cfg.system_prompt)
    longest = max(len(build_prompt(tokenizer, r["question"], system_prompt)) for r in rows)
    generated.data.max_prompt_length = longest
    generated.actor_rollout_ref.rollout.prompt_length = longest


def cpu_overrides(cfg: DictConfig, teacher: bool = False, separate: bool = False) -> DictConfig:
    """cpu.py's settings for this run (importing cpu.py patches nothing until ``activate``);
    ``teacher``: the run has OPD's teacher servers; ``separate``: its vLLM servers run apart from
    the actor (``rl.async_training``)."""
    from cbpo.device import resolve_dtype
    from cbpo.backends.verl import cpu

    dtype = str(resolve_dtype(cfg.dtype, torch.device("cpu"))).removeprefix("torch.")
    return OmegaConf.create(cpu.config_overrides(dtype, teacher, separate))


def write_inputs(cfg: DictConfig, generated: DictConfig, rows) -> None:
    """What verl's processes read: the training rows as verl's dataset (``prompt`` in chat
    form for its length filter; the suite's row, as JSON, in ``extra_info``), the run's config
    for the task runner and the agent-loop workers, and the file that registers ``cbpo_group``
    in every agent-loop worker (verl's ``agent_loop_config_path``)."""
    import pandas as pd

    from cbpo.backends.verl.trainer import SUITE_CONFIG, GroupAgentLoop
    from cbpo.chat import messages, resolve_system_prompt

    verl_dir = Path(generated.trainer.default_local_dir)
    verl_dir.mkdir(parents=True, exist_ok=True)
    system_prompt = resolve_system_prompt(cfg.system_prompt)
    pd.DataFrame([{"prompt": messages(r["question"], system_prompt), "data_source": r.get("domain", ""),
                   "extra_info": {"index": i, "row": json.dumps(r)}} for i, r in enumerate(rows)]
                 ).to_parquet(generated.data.train_files)
    OmegaConf.save(cfg, verl_dir / SUITE_CONFIG, resolve=True)
    loop = {"name": verl_config.AGENT_LOOP, "_target_": f"{GroupAgentLoop.__module__}.{GroupAgentLoop.__qualname__}"}
    OmegaConf.save(OmegaConf.create([loop]), generated.actor_rollout_ref.rollout.agent.agent_loop_config_path)
