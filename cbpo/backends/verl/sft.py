"""``python -m cbpo.train stage=sft backend=verl``: the shared initialisation trained by verl's own
FSDP SFT trainer (``verl.trainer.sft_trainer.SFTTrainer``, one process per GPU under torchrun,
several nodes through torchrun's rendezvous) on the suite's traces, with the local trainer's
loss mask, and the local trainer's ``final/`` contract, so RL starts from it unchanged.

The traces are encoded by the suite's ``cbpo.chat.encode_trace`` (the same tokens, loss on model
tokens only: never a prompt or a tool observation) and handed to verl as its dataset
(``SuiteSFTDataset``, verl's ``data.custom_cls``, no-padding mode): verl's own loss marks a token
as the local one does (the mask marks the predicted token; verl shifts it onto its log-probs).
The run folder is the local backend's (one writer, ``run_key.json``, provenance,
``metrics.jsonl`` with ``sft_loss``/``lr``/``wall_seconds`` per logged step); verl's checkpoints
live in ``verl/`` and resume after a crash (``resume_mode: auto``). What differs from the local
trainer, by verl's design: its data loader shuffles epochs of the rows where the local trainer
draws each step's batch from (seed, step), its micro-batches are ``micro_batch_per_gpu`` rows,
and its cosine schedule is verl's.
"""
from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import torch
from omegaconf import DictConfig, OmegaConf

from cbpo.backends.verl import config as verl_config

SFT_CONFIG = "sft.yaml"  # verl's SFT config for the run, composed by the launch
SUITE_CONFIG = "suite.yaml"
TRAIN_FILE = "sft.parquet"


class SuiteSFTDataset(torch.utils.data.Dataset):
    """verl's SFT dataset interface (``create_sft_dataset``'s keywords) over the rows the launch
    encoded: token ids and loss mask per row, unpadded (verl's ``no_padding`` mode)."""

    def __init__(self, parquet_files, tokenizer=None, config=None, processor=None, max_samples: int = -1):
        import pandas as pd

        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        if max_samples is not None and max_samples > 0:
            frame = frame.iloc[:max_samples]
        self.input_ids = [list(map(int, ids)) for ids in frame["input_ids"]]
        self.loss_mask = [list(map(int, m)) for m in frame["loss_mask"]]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        ids = torch.tensor(self.input_ids[i], dtype=torch.long)
        return {"input_ids": ids, "position_ids": torch.arange(len(ids)),
                "loss_mask": torch.tensor(self.loss_mask[i], dtype=torch.long)}


def overrides(cfg: DictConfig, sft, verl_cfg, init: Path, out: Path, on_cpu: bool) -> list[str]:
    """The suite's SFT settings as overrides of verl's ``sft_trainer_engine`` config. Each GPU
    trains its share of the batch in micro-batches of at most ``verl.micro_batch_per_gpu`` rows
    that divide the share (verl requires it; the size only trades memory for time)."""
    world = verl_cfg.nodes * verl_cfg.gpus_per_node
    if sft.batch_size % world:
        raise ValueError(f"sft.batch_size={sft.batch_size} does not split over {world} GPUs "
                         f"({verl_config.shape(verl_cfg)}); or change sft.batch_size")
    micro = math.gcd(verl_cfg.micro_batch_per_gpu, sft.batch_size // world)
    platform = {"model.use_remove_padding": "true", "engine.dtype": "bfloat16", "trainer.device": "cuda"}
    if on_cpu:
        from cbpo.backends.verl import cpu

        platform = cpu.sft_overrides()
    return [
        f"model.path={init}",
        f"data.train_files={out / 'verl' / TRAIN_FILE}", "data.val_files=null",
        f"data.custom_cls.path={__file__}", "data.custom_cls.name=SuiteSFTDataset",
        f"data.train_batch_size={sft.batch_size}", f"data.micro_batch_size_per_gpu={micro}",
        "data.use_dynamic_bsz=false", "data.pad_mode=no_padding", f"data.max_length={sft.max_len}",
        "data.truncation=error", "data.num_workers=0",
        f"optim.lr={sft.lr}", f"optim.weight_decay={sft.weight_decay}", f"optim.lr_warmup_steps={sft.warmup_steps}",
        f"optim.lr_scheduler_type={sft.decay}", f"optim.min_lr_ratio={sft.min_lr_ratio}",
        "engine.strategy=fsdp2", f"engine.seed={sft.seed}",
        f"trainer.default_local_dir={out / 'verl'}", f"trainer.project_name={cfg.wandb.project}",
        f"trainer.experiment_name={cfg.run_name}", "trainer.logger=[console]", f"trainer.seed={sft.seed}",
        f"trainer.total_training_steps={sft.steps}", "trainer.total_epochs=1000000",  # steps decide
        f"trainer.save_freq={sft.checkpoint_every}", "trainer.test_freq=-1", "trainer.resume_mode=auto",
        "trainer.max_ckpt_to_keep=1", f"trainer.nnodes={verl_cfg.nodes}",
        f"trainer.n_gpus_per_node={verl_cfg.gpus_per_node}",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        *(f"{key}={value}" for key, value in platform.items()),
    ]


def compose(args: list[str]) -> DictConfig:
    """verl's own ``sft_trainer_engine`` config with ``args``, as ``python -m
    verl.trainer.sft_trainer`` composes it (the calling entry point's Hydra state is kept)."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
            return hydra_compose("sft_trainer_engine", overrides=args)
    finally:
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def write_inputs(cfg: DictConfig, rows, init: Path, out: Path, sft) -> None:
    """The rows encoded as the local trainer encodes them, and the run's config."""
    import pandas as pd
    from transformers import AutoTokenizer

    from cbpo.chat import encode_trace, resolve_system_prompt

    tokenizer = AutoTokenizer.from_pretrained(init)
    system_prompt = resolve_system_prompt(cfg.system_prompt)
    examples = [encode_trace(tokenizer, r["question"], r["trace"], system_prompt) for r in rows]
    too_long = sum(len(ids) > sft.max_len for ids, _ in examples)
    if too_long:
        raise ValueError(f"{too_long} SFT examples exceed max_len={sft.max_len} tokens")
    verl_dir = out / "verl"
    verl_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"input_ids": [ids for ids, _ in examples], "loss_mask": [m for _, m in examples]}).to_parquet(
        verl_dir / TRAIN_FILE)
    OmegaConf.save(cfg, verl_dir / SUITE_CONFIG, resolve=True)


def torchrun(verl_cfg, out: Path, env: dict) -> list[str]:
    """One process per GPU on each of ``verl.nodes`` nodes. On several nodes, one torchrun per
    node of the SLURM allocation this launch runs in (``srun``, one task per node; the sft rule
    submits such an allocation), meeting at this node, the allocation's first (the batch
    script's), by torchrun's static rendezvous (``--master_addr``, a node rank per task)."""
    nodes = verl_cfg.nodes
    per_node = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={verl_cfg.gpus_per_node}",
                f"--nnodes={nodes}"]
    script = ["-m", __name__, str(out)]
    if nodes == 1:
        return [*per_node, "--standalone", *script]
    allocated = allocation_nodes(env)
    if allocated < nodes:
        held = f"{allocated} node(s) of SLURM job {env['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in env else "no SLURM allocation"
        raise RuntimeError(f"verl.nodes={nodes} trains SFT on {nodes} nodes of one SLURM allocation (the sft rule "
                           f"submits one: --nodes={nodes}); this process has {held}")
    host = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()[0]
    # SLURM's gpu GRES sets ROCR_VISIBLE_DEVICES in every step; verl refuses it beside
    # CUDA_VISIBLE_DEVICES (slurm/ray-on-slurm.sh drops it for the same reason). Each task's
    # node rank is its SLURM node id (torchrun reads PET_NODE_RANK); rank 0's node, this one,
    # holds the store.
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "env", "-u", "ROCR_VISIBLE_DEVICES", "sh", "-c", 'PET_NODE_RANK="$SLURM_NODEID" exec "$@"', "sh",
            *per_node, f"--master_addr={host}", f"--master_port={env.get('MASTER_PORT') or free_port()}", *script]


def allocation_nodes(env: dict) -> int:
    """The nodes of the SLURM job this process runs in (0 outside one). Snakemake's job-step plugin
    runs a job of several nodes in its batch script with every SLURM_* variable but the job id
    removed, so SLURM is asked where the variable is gone."""
    if "SLURM_JOB_ID" not in env:
        return 0
    if "SLURM_JOB_NUM_NODES" in env:
        return int(env["SLURM_JOB_NUM_NODES"])
    listed = subprocess.run(["squeue", "-h", "-j", env["SLURM_JOB_ID"], "-o", "%D"], capture_output=True, text=True)
    return int(listed.stdout.strip() or 0)


def free_port() -> int:
    """A port free on this node now, for the rendezvous it hosts."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run(out: Path) -> None:
    """One torchrun process: verl's SFT trainer on the launch's config; rank 0 writes the
    metrics lines and, at the end, ``final/``."""
    from verl.trainer import sft_trainer
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
    from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group

    from cbpo.runlog import MetricsLog, save_checkpoint

    verl_dir = out / "verl"
    config = OmegaConf.load(verl_dir / SFT_CONFIG)
    cfg = OmegaConf.load(verl_dir / SUITE_CONFIG)
    initialize_global_process_group()
    rank0 = torch.distributed.get_rank() == 0
    log = MetricsLog(out / "metrics.jsonl", cfg.wandb, OmegaConf.to_container(cfg)) if rank0 else None
    since = [time.perf_counter()]

    class Tracking(sft_trainer.Tracking):
        # verl logs every step; the suite's line is written every sft.log_every steps and at the end
        def log(self, data, step, backend=None):
            super().log(data, step, backend)
            if "train/loss" in data and (step % cfg.sft.log_every == 0 or step == config.trainer.total_training_steps):
                now = time.perf_counter()
                log.log({"step": int(step), "sft_loss": float(data["train/loss"]), "lr": float(data["train/lr"]),
                         "grad_norm": float(data.get("train/grad_norm", float("nan"))),
                         "tokens": int(data["train/global_tokens"]), "wall_seconds": now - since[0]})
                since[0] = now

    try:
        with patch.object(sft_trainer, "Tracking", Tracking):
            trainer = sft_trainer.SFTTrainer(config=config)
            if rank0:
                log.truncate_after(trainer.resume_global_step)  # a resumed run keeps its checkpoint's steps
            trainer.fit()
    finally:
        if log is not None:
            log.close()
    if rank0:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        weights = Path(find_latest_ckpt_path(config.trainer.default_local_dir)) / "huggingface"
        model = AutoModelForCausalLM.from_pretrained(weights, dtype="auto")
        save_checkpoint(out / "final", model, AutoTokenizer.from_pretrained(config.model.path),
                        {"step": "final", "seconds": time.perf_counter() - since[0]})
    destroy_global_process_group()


def launch(cfg: DictConfig, out: Path, verl_cfg, on_cpu: bool, env: dict) -> None:
    """Compose and check verl's config, then train under torchrun (or print it: verl.dry_run)."""
    from cbpo.data import load_split
    from cbpo.models import resolve_model
    from cbpo.schema import settings

    sft = settings(cfg, "sft")
    try:
        init = resolve_model(cfg.model.name, Path(cfg.paths.models_dir)).absolute()
    except FileNotFoundError:
        if not verl_cfg.dry_run:
            raise
        init = (Path(cfg.paths.models_dir) / cfg.model.name).absolute()  # where the DAG prepares it
    config = compose(overrides(cfg, sft, verl_cfg, init, out, on_cpu))
    if verl_cfg.dry_run:
        print(OmegaConf.to_yaml(config))
        return
    from cbpo.runs import claim_run

    command = torchrun(verl_cfg, out, env)  # before the run is claimed: a missing allocation stops here
    rows = load_split(cfg.data, cfg.paths.data_dir, "sft")
    writer = claim_run(cfg, out, rows, init, backend_state=["verl"])
    if writer is None:
        return
    with writer:
        write_inputs(cfg, rows, init, out, sft)
        OmegaConf.save(config, out / "verl" / SFT_CONFIG)
        done = subprocess.run(command, env=env)
    if done.returncode:
        raise RuntimeError(f"verl's SFT trainer failed (exit {done.returncode}); its output is above")
    print(f"wrote {out / 'final'}")


if __name__ == "__main__":
    run(Path(sys.argv[1]))
