"""The verl configuration a run of the suite maps onto (``verl.*`` settings and ``build``).

Every knob comes from the suite's config (model, data, method, rollout, rl, tools): the same
YAML trains on either backend. Credit is the suite's own for every method: ``algorithm.
adv_estimator`` names the estimator verl would use on its own, for the methods it has one for
(GRPO, REINFORCE++ and its -baseline variant), and is overridden by ``credit.py`` in the trainer subclass, which
sees the batch's non-tensor data (prefix groups, branch points) that a registered estimator
never receives (verl 0.9's ``compute_advantage`` passes it rewards, the response mask and uid).
OPD is the exception: its advantage needs the teacher, so it is verl's own on-policy distillation
(``distillation``), with the teacher on GPUs of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cbpo.objective import DUAL_CLIP_OFF, clip_ratios
from cbpo.registry import get_method, verl_estimator


@dataclass
class VerlConfig:
    """The ``verl`` section: the cluster shape and what only verl needs."""

    nodes: int  # Ray nodes (SLURM: one task per node, see README)
    gpus_per_node: int
    tensor_parallel: int  # vLLM tensor parallel size per rollout replica
    gpu_memory_utilization: float  # vLLM's share while the actor sleeps (verl frees it between phases)
    micro_batch_per_gpu: int  # sequences per forward/backward per GPU (memory only)
    # OPD's teacher (method.teacher) runs on verl's distillation resource pool, GPUs beside the
    # nodes x gpus_per_node above: whole nodes of gpus_per_node, or part of one
    teacher_gpus: int
    teacher_tensor_parallel: int  # vLLM tensor parallel size per teacher replica
    # rl.async_training=one_step_off: the vLLM servers' GPUs on each node, beside the actor's
    # gpus_per_node - async_rollout_gpus (verl's separate rollout pool)
    async_rollout_gpus: int = 4
    dry_run: bool = False  # print the generated verl config (validated) and stop: no GPU needed

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "tensor_parallel", "micro_batch_per_gpu", "teacher_gpus",
                     "teacher_tensor_parallel", "async_rollout_gpus"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gpus_per_node % self.tensor_parallel:
            raise ValueError(f"tensor_parallel ({self.tensor_parallel}) must divide gpus_per_node ({self.gpus_per_node})")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1), got {self.gpu_memory_utilization}")


# verl's advantage estimator for a method that declares none (registry.register_method's
# verl_estimator): the suite's credit alone (credit.py), named so in verl's logs
SUITE_CREDIT = "cbpo_suite_credit"
AGENT_LOOP = "cbpo_group"  # the M calls of a problem share its group (agent_loop.GroupRollouts)
AGENT_LOOPS = "agent_loops.yaml"  # in verl's run folder: registers AGENT_LOOP in every agent-loop worker
AGENT_WORKERS = 8  # verl's default number of agent-loop workers, at most


def verl_yaml() -> Path:
    """verl's full PPO config as its Hydra run composes it (the generated, flattened file)."""
    import verl

    return Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def overrides(cfg: DictConfig, method_cfg, rl, verl_cfg: VerlConfig, train_files: str, out: Path) -> dict:
    """The suite's settings as verl keys (a nested dict merged onto verl's defaults)."""
    from cbpo.rollout.vllm_engine import max_logprobs  # torch and transformers: not for the Snakefile's parse
    objective = method_cfg.objective()
    budget = getattr(method_cfg, "budget", cfg.rollout.budget)
    agent = rl.agent
    if rl.problems_per_step % rl.ppo_mini_batches:
        raise ValueError(f"rl.ppo_mini_batches={rl.ppo_mini_batches} must divide rl.problems_per_step="
                         f"{rl.problems_per_step}: verl's mini-batches are whole prompts")
    return {
        "data": {
            "train_files": train_files, "val_files": train_files,
            "train_batch_size": rl.problems_per_step, "max_prompt_length": agent.max_total_tokens - agent.max_new_tokens,
            "max_response_length": agent.max_total_tokens, "seed": rl.seed, "shuffle": True,
            "return_raw_chat": True,
        },
        "actor_rollout_ref": {
            "model": {"path": str(cfg.init)},
            "actor": {
                # in prompts: rl.ppo_mini_batches optimiser steps per batch, as the local trainer
                "ppo_mini_batch_size": rl.problems_per_step // rl.ppo_mini_batches,
                "ppo_micro_batch_size_per_gpu": verl_cfg.micro_batch_per_gpu,
                "ppo_epochs": 1,
                **clip_ratios(objective), "clip_ratio_c": DUAL_CLIP_OFF,  # as the local loss
                "loss_agg_mode": objective.loss_agg_mode,
                # seq-mean-token-sum-norm's constant: the response budget, as the local trainer's
                # (objective.loss_normalisers); verl's default is each micro-batch's padded width
                "loss_scale_factor": agent.max_total_tokens,
                "policy_loss": {"loss_mode": objective.policy_loss},
                "use_kl_loss": objective.beta > 0, "kl_loss_coef": objective.beta, "kl_loss_type": objective.kl_estimator,
                "grad_clip": rl.max_grad_norm,
                "optim": {"lr": rl.lr, "weight_decay": rl.weight_decay},
                # hf_model: every checkpoint also holds plain weights, which become the run's final/
                "checkpoint": {"save_contents": ["model", "optimizer", "extra", "hf_model"]},
            },
            "rollout": {
                "name": "vllm", "mode": "async", "n": budget,
                "temperature": rl.temperature, "top_p": 1.0, "top_k": -1,
                "prompt_length": agent.max_total_tokens - agent.max_new_tokens, "response_length": agent.max_total_tokens,
                "tensor_model_parallel_size": verl_cfg.tensor_parallel,
                "gpu_memory_utilization": verl_cfg.gpu_memory_utilization,
                "enable_prefix_caching": True,  # branches continue their parent's exact token prefix
                # the suite's server (server.py): Eq. 6 is the raw distribution's, and K top log-probs
                # per token must be allowed (K: the method's, else ServerEngine's 10, under vLLM's cap)
                "logprobs_mode": "raw_logprobs",
                "engine_kwargs": {"vllm": {"max_logprobs": max_logprobs(getattr(method_cfg, "top_k", 0))}},
                "log_prob_micro_batch_size_per_gpu": verl_cfg.micro_batch_per_gpu,
                "multi_turn": {"enable": True, "max_assistant_turns": agent.max_tool_calls + 1},
                # verl cuts the batch into num_workers contiguous chunks; a divisor of the problem
                # count keeps each problem's M rows, one group, in one worker
                "agent": {"default_agent_loop": AGENT_LOOP, "num_workers": math.gcd(AGENT_WORKERS, rl.problems_per_step),
                          "agent_loop_config_path": str(out / "verl" / AGENT_LOOPS)},
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": verl_cfg.micro_batch_per_gpu},
        },
        "algorithm": {"adv_estimator": estimator(cfg.method.name, method_cfg), **reward_kl(method_cfg)},
        "distillation": distillation(method_cfg, verl_cfg) if get_method(cfg.method.name).distilled else {"enabled": False},
        "critic": {"enable": False},
        "trainer": {
            "nnodes": verl_cfg.nodes, "n_gpus_per_node": verl_cfg.gpus_per_node,
            "total_training_steps": rl.steps, "save_freq": rl.checkpoint_every,
            "default_local_dir": str(out / "verl"), "resume_mode": "auto",
            "logger": ["console"], "project_name": cfg.wandb.project, "experiment_name": str(cfg.run_name),
            "val_before_train": False, "test_freq": -1,
            # the suite's trainer subclasses the v0 RayPPOTrainer: its batch is a DataProto that carries
            # the agent loop's per-rollout fields to the advantage step (v1 keeps them in TransferQueue)
            "use_v1": False, "max_actor_ckpt_to_keep": 1,  # as the local trainer, the newest checkpoint only
        },
    }


def one_step_off(verl_cfg: VerlConfig) -> dict:
    """``rl.async_training=one_step_off``: verl's one-step-off-policy trainer (``verl.experimental.
    one_step_off_policy``, the task runner in trainer.py) as its own config file sets it up. The
    actor and the vLLM servers on GPUs of their own (no hybrid engine: the servers keep their
    weights and KV cache while the actor trains), weights pushed over verl's NCCL checkpoint
    engine after each update, and verl's bypass mode: the PPO ratio is taken against the log-probs
    of the policy that sampled (the servers', one step behind the actor), not recomputed."""
    rollout = verl_cfg.async_rollout_gpus
    if not rollout < verl_cfg.gpus_per_node or rollout % verl_cfg.tensor_parallel:
        raise ValueError(f"verl.async_rollout_gpus ({rollout}) must leave the actor GPUs on each node (verl.gpus_per_node="
                         f"{verl_cfg.gpus_per_node}) and be a multiple of verl.tensor_parallel ({verl_cfg.tensor_parallel})")
    return {
        "actor_rollout_ref": {
            "hybrid_engine": False,
            "rollout": {"nnodes": verl_cfg.nodes, "n_gpus_per_node": rollout, "free_cache_engine": False,
                        "calculate_log_probs": True, "checkpoint_engine": {"backend": "nccl"}},
        },
        "algorithm": {"rollout_correction": {"bypass_mode": True}},
        "trainer": {"n_gpus_per_node": verl_cfg.gpus_per_node - rollout},
        # the loop draws a batch ahead from a data loader it never closes: its worker processes
        # would be killed under it at the end (a traceback after a finished run); the suite's
        # rows are read in-process instead
        "data": {"dataloader_num_workers": 0},
    }


def held_gpus(config: DictConfig) -> int:
    """The GPUs a verl config holds: the trainer's pool, the separate rollout pool (no hybrid
    engine) and an OPD teacher's (verl's distillation) beside them."""
    gpus = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if not config.actor_rollout_ref.hybrid_engine:
        gpus += config.actor_rollout_ref.rollout.nnodes * config.actor_rollout_ref.rollout.n_gpus_per_node
    teacher = config.get("distillation")
    if teacher is not None and teacher.enabled:
        gpus += teacher.nnodes * teacher.n_gpus_per_node
    return gpus


def shape(verl_cfg: VerlConfig) -> str:
    """A job's nodes and GPUs per node, and the settings that change them (for an error message)."""
    return (f"verl.nodes={verl_cfg.nodes} x verl.gpus_per_node={verl_cfg.gpus_per_node}; in the DAG set them with "
            "--config verl_nodes=N verl_gpus_per_node=G, which under a cluster profile follow resources.<stage>.gpu")


def estimator(name: str, method_cfg) -> str:
    return verl_estimator(get_method(name), method_cfg) or SUITE_CREDIT


def reward_kl(method_cfg) -> dict:
    """REINFORCE++'s k1 KL in the token reward (``kl_coef`` > 0) as verl's ``use_kl_in_reward``
    with a fixed coefficient: verl then computes the reference log-probs the suite's credit reads
    (credit.py), and its own penalised ``token_level_rewards``, which the suite does not use."""
    beta = getattr(method_cfg, "kl_coef", 0.0)
    if not beta:
        return {"use_kl_in_reward": False}
    return {"use_kl_in_reward": True, "kl_penalty": "kl", "kl_ctrl": {"type": "fixed", "kl_coef": beta}}


def teacher_pool(verl_cfg: VerlConfig) -> tuple[int, int]:
    """(GPUs per node, nodes) of the teacher's resource pool; a replica never spans two nodes."""
    per_node = min(verl_cfg.teacher_gpus, verl_cfg.gpus_per_node)
    if verl_cfg.teacher_gpus % per_node or per_node % verl_cfg.teacher_tensor_parallel:
        raise ValueError(f"verl.teacher_gpus ({verl_cfg.teacher_gpus}) must be whole nodes of verl.gpus_per_node "
                         f"({verl_cfg.gpus_per_node}) or part of one, and verl.teacher_tensor_parallel "
                         f"({verl_cfg.teacher_tensor_parallel}) must divide the teacher's GPUs per node")
    return per_node, verl_cfg.teacher_gpus // per_node


def distillation(method_cfg, verl_cfg: VerlConfig) -> dict:
    """OPD (baselines/opd.py) as verl's on-policy distillation: verl's teacher servers score each
    student rollout as the agent loop returns it (log pi_T of every token, vLLM's prompt log-probs),
    and the k1 estimator with policy gradient gives every model token the advantage
    -(log pi_S - log pi_T) in verl's vanilla PPO loss; use_task_rewards=false drops the loss on
    the task advantage, which OPD's objective has none of."""
    if not method_cfg.teacher:
        raise ValueError("opd needs a teacher: set method.teacher to a checkpoint that shares the student's tokenizer")
    per_node, nodes = teacher_pool(verl_cfg)
    # a local checkpoint is read by the teacher's servers, which may run on another node
    teacher = Path(method_cfg.teacher)
    return {
        "enabled": True, "n_gpus_per_node": per_node, "nnodes": nodes,
        "distillation_loss": {
            "loss_mode": "k1", "use_policy_gradient": True, "use_task_rewards": False,
            "loss_max_clamp": None, "log_prob_min_clamp": None,  # OPD clamps neither the reward nor the log-probs
            **clip_ratios(method_cfg.objective()),
        },
        # one teacher: verl routes every row to it, whatever the row's teacher_key (data_source, the domain)
        "teacher_models": {"teacher_model": {
            "model_path": str(teacher.absolute()) if teacher.is_dir() else method_cfg.teacher,
            "inference": {"tensor_model_parallel_size": verl_cfg.teacher_tensor_parallel},
        }},
    }


def build(cfg: DictConfig, method_cfg, rl, verl_cfg: VerlConfig, train_files: str, out: Path) -> DictConfig:
    """verl's config for this run, checked as verl's ``main_ppo`` checks it: merged in struct
    mode (a key verl does not have is an error, not a silent no-op), then ``validate_config``,
    which builds verl's config dataclasses and runs their checks, and the distillation section's
    dataclass, which verl's trainer builds only once its workers are up."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    base = OmegaConf.load(verl_yaml())
    OmegaConf.set_struct(base, True)
    # vLLM's own engine arguments: a free-form dict in verl, passed on to `vllm serve` as they are
    OmegaConf.set_struct(base.actor_rollout_ref.rollout.engine_kwargs.vllm, False)
    merged = OmegaConf.merge(base, overrides(cfg, method_cfg, rl, verl_cfg, train_files, out),
                             one_step_off(verl_cfg) if rl.async_training == "one_step_off" else {})
    try:
        validate_config(merged, use_reference_policy=need_reference_policy(merged), use_critic=need_critic(merged))
    except (AssertionError, ValueError) as e:
        raise ValueError(f"verl refuses this run's config: {e} (the job's shape: {shape(verl_cfg)})") from e
    if merged.distillation.enabled:
        omega_conf_to_dataclass(merged.distillation)
    return merged
