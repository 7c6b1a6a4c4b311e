"""verl's side of ``backend=verl``: the classes verl's Ray processes build. ``SuiteTaskRunner``
(verl's task runner, with the suite's trainer), ``SuiteTrainer`` (verl's ``RayPPOTrainer`` with
the suite's credit, run layout and vLLM server, server.py; ``SuiteOneStepTrainer`` the same on
verl's one-step-off-policy trainer, ``rl.async_training=one_step_off``) and ``GroupAgentLoop``
(the agent loop registered as ``cbpo_group``). Imports verl and Ray: only the launch and verl's workers
load this module.

Written against verl 0.9.1's source. The unit tests stop at the Ray boundary (the advantage
step, the metrics line, the final checkpoint, the agent loop's registration and outputs); the
engine tier (tests/cbpo/backends/test_verl_cpu.py) runs the task runner, the worker groups and
vLLM for real on CPU, through cpu.py. No GPU has run them yet.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import ray
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.experimental.separation import ray_trainer as separate_trainer
from verl.experimental.separation import utils as separate
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
from verl.utils import tracking
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.model import compute_position_id_with_mask
from verl.workers.rollout.replica import RolloutReplicaRegistry

from cbpo import registry
from cbpo.backends.verl import credit
from cbpo.backends.verl.agent_loop import BATCH_ROWS, DRAW_STATS, PREFILL_STATS, STEP, GroupRollouts, ServerEngine
from cbpo.backends.verl.config import AGENT_LOOP, held_gpus
from cbpo.chat import build_prompt, resolve_system_prompt
from cbpo.registry import build_method
from cbpo.reward import Rewarder
from cbpo.schema import settings
from cbpo.tasks import environment_tools
from cbpo.tools import SEARCH_STATS
from cbpo.reward import reward_rollouts
from cbpo.runlog import MetricsLog, save_checkpoint
from cbpo.trajectory import Trajectory

SUITE_CONFIG = "suite.yaml"  # beside verl's checkpoints: the run's composed config, read by every process


def rollout_stats(t: Trajectory, row) -> dict:
    """What the metrics line needs of a rollout besides its reward, carried in ``extra_fields``
    beside credit's fields. Tool calls copied from a parent were not run again."""
    return {"cbpo_domain": row.get("domain", ""), "cbpo_generated_tokens": t.generated_tokens,
            "cbpo_tool_calls": t.tool_calls - t.copied_tool_calls, "cbpo_tool_seconds": t.tool_seconds}


def search_fields(searches: dict) -> dict:
    """The agent loop's search counts for a rollout (``GroupRollouts.rollout``), as extra fields;
    all None where the run has no search tool."""
    return {f"cbpo_{key}": searches.get(key) for key in SEARCH_STATS}


def step_searches(non_tensor) -> dict:
    """A step's search counts under the local trainer's names (``step_search_stats``): none
    without a search tool, a count None where the search has no cache."""
    counts = {key: list(non_tensor[f"cbpo_{key}"]) for key in SEARCH_STATS}
    if counts["search_calls"][0] is None:  # the run has no search tool
        return {}
    return {key: None if None in n else int(sum(n)) for key, n in counts.items()}


def group_fields(counts: dict) -> dict:
    """A group's prefill counts and draws of replacement problems (``GroupRollouts.rollout``) as
    extra fields; no draws for a method that draws none."""
    return {f"cbpo_{key}": counts[key] for key in (*PREFILL_STATS, *DRAW_STATS) if key in counts}


def step_group_counts(non_tensor) -> dict:
    """A step's group counts under the local trainer's names: the prompt tokens its requests
    prefilled, those vLLM's prefix cache served and the rest (``rollout_counts`` of the local
    vLLM engine), and its draws (DAPO's ``step_stats``): its informative groups and the
    rollouts drawn and not trained on, with their tokens and tool calls."""
    return {key: int(sum(non_tensor[f"cbpo_{key}"])) for key in (*PREFILL_STATS, *DRAW_STATS)
            if f"cbpo_{key}" in non_tensor}


def step_rollouts(data) -> dict:
    """The rollout part of a step's metrics line, under the local trainer's names, from verl's
    batch after rewards."""
    nt = data.non_tensor_batch
    rewards = data.batch["token_level_scores"].sum(-1).cpu().numpy()  # outcome rewards, before a KL penalty
    domains = np.array([str(d) for d in nt["cbpo_domain"]])
    kinds = [str(k) for k in nt["cbpo_kind"]]
    return {
        "reward": float(rewards.mean()),
        **{f"reward/{d or 'none'}": float(rewards[domains == d].mean()) for d in sorted(set(domains))},
        "problems": len(set(nt["uid"])),
        "rollouts": len(rewards),
        "generated_tokens": int(sum(nt["cbpo_generated_tokens"])),
        "tool_calls": int(sum(nt["cbpo_tool_calls"])),
        "tool_seconds": float(sum(nt["cbpo_tool_seconds"])),
        **{f"n_{k}": kinds.count(k) for k in sorted({"parent", "branch", "fill"} | set(kinds))},
        **step_searches(nt),
        **step_group_counts(nt),
    }


def hinted_batch(data, rows: list[int], pad_id: int) -> DataProto:
    """The batch's ``rows`` in verl's layout (its agent loop's ``_agent_loop_postprocess``) with
    each row's hinted prompt (``cbpo_hinted_prompt``) in place of its hint-free one and the same
    response: ``prompts`` left-padded, ``responses`` and ``response_mask`` the batch's,
    ``input_ids`` both, ``attention_mask`` and text-only ``position_ids`` from it, and the
    batch's ``meta_info`` (temperature). Hinted prompts are longer than the rows' own and may
    exceed ``rollout.prompt_length``, the width of the batch's prompt block: this block is as
    wide as the longest of them instead, which the actor accepts (it strips the padding,
    ``left_right_2_no_padding``); each sequence is the one the server sampled, so it fits the
    model's context."""
    prompts = [torch.as_tensor(list(data.non_tensor_batch["cbpo_hinted_prompt"][r]), dtype=torch.long) for r in rows]
    index = torch.as_tensor(rows)
    responses = data.batch["responses"][index]
    prompt_ids = torch.nn.utils.rnn.pad_sequence(prompts, batch_first=True, padding_value=pad_id, padding_side="left")
    prompt_mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True,
                                                  padding_side="left")
    response_attention = data.batch["attention_mask"][index, -responses.shape[1]:]
    attention_mask = torch.cat([prompt_mask.to(response_attention.dtype), response_attention], dim=1)
    return DataProto.from_dict(tensors={
        "prompts": prompt_ids, "responses": responses, "response_mask": data.batch["response_mask"][index],
        "input_ids": torch.cat([prompt_ids, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
    }, meta_info=dict(data.meta_info))


def policy_stats(metrics) -> dict:
    """verl's actor metrics (``actor/pg_loss``, ``actor/grad_norm``, ...) under the local
    trainer's names (``pg_loss``, ``grad_norm``; its KL term is ``kl``)."""
    stats = {k.removeprefix("actor/"): float(v) for k, v in metrics.items() if k.startswith("actor/")}
    if "kl_loss" in stats:
        stats["kl"] = stats.pop("kl_loss")
    return stats


class SuiteSteps:
    """What the suite changes in a verl trainer (``SuiteTrainer``, ``SuiteOneStepTrainer``):
    every method's credit from ``credit.assign`` and the suite's run layout: ``metrics.jsonl``
    (the local trainer's keys, truncated to the checkpoint on resume), verl's checkpoints in the
    run's ``verl/`` folder, and ``final/`` with DONE.json at the end."""

    def __init__(self, *args, method, run_dir: Path, log: MetricsLog, **kwargs):
        super().__init__(*args, **kwargs)
        self.method, self.run_dir, self.log = method, Path(run_dir), log
        self._rollouts: dict = {}
        self._save_due = False

    def fit(self):
        # verl 0.9.1's fit calls the module-level compute_advantage (each trainer module imports
        # its own name) and builds its Tracking logger inside the loop; neither is a method, so
        # both are swapped for the length of this fit only: the advantage step becomes the
        # suite's credit, and every step verl logs (timings and actor metrics included) also
        # writes the suite's metrics line.
        trainer = self

        class Tracking(tracking.Tracking):
            def log(self, data, step, backend=None):
                super().log(data, step, backend)
                trainer.log_step(data, step)

        try:
            with patch.object(ray_trainer, "compute_advantage", self.suite_credit), \
                 patch.object(separate_trainer, "compute_advantage", self.suite_credit), \
                 patch.object(tracking, "Tracking", Tracking):
                done = super().fit()
                if asyncio.iscoroutine(done):  # the one-step-off trainer's loop is a coroutine
                    asyncio.run(done)
        finally:
            self.log.close()
        self.finish()

    def batch_step(self) -> int:
        """The step the batch being drawn trains (DAPO seeds its replacement draws with it)."""
        return self.global_steps

    def suite_credit(self, data, *_, **__):
        """verl's advantage step (``compute_advantage``'s place): the method's own credit on the
        batch, which also sets the loss mask; verl's estimator is never called. OC-GRPO's
        privileged rollouts are first rescored by the actor in their hinted context."""
        if self.method.off_context_credit:
            credit.off_context(data, self.method, self.behaviour_log_probs(data))
        credit.assign(data, self.method)
        self._rollouts = step_rollouts(data)
        return data

    def behaviour_log_probs(self, data) -> torch.Tensor:
        """log pi_b(y_t | x, p, y_<t) of the privileged rows' response tokens (``credit.
        privileged_rows``, responses right-padded as in the batch): the privileged rows with
        their hinted prompts (``hinted_batch``) through the call that gave the batch its
        ``old_log_probs`` (verl's ``_compute_old_log_prob``: the actor before this step's update,
        at the batch's ``meta_info`` temperature, ``rollout.temperature``), padded to a multiple
        of the actor's data-parallel size as verl pads its batches for a worker group."""
        rows = credit.privileged_rows(data)
        if not rows:
            return torch.zeros((0, data.batch["responses"].shape[1]))
        hinted, pad = pad_dataproto_to_divisor(hinted_batch(data, rows, self.tokenizer.pad_token_id),
                                               self._get_dp_size(self.actor_rollout_wg, "actor"))
        hinted.meta_info["global_token_num"] = hinted.batch["attention_mask"].sum(-1).tolist()  # verl's MFU count
        out, _ = self._compute_old_log_prob(hinted)
        return unpad_dataproto(out, pad).batch["old_log_probs"]

    def _get_gen_batch(self, batch):
        # the agent loop sees only the rows' columns: the step seeds DAPO's replacement draws,
        gen_batch = super()._get_gen_batch(batch)
        gen_batch.non_tensor_batch[STEP] = np.full(len(gen_batch), self.batch_step(), dtype=np.int64)
        # and each row knows the batch's rows: replacements are dealt so no problem serves two rows
        rows = [int(info["index"]) for info in gen_batch.non_tensor_batch["extra_info"]]
        column = np.empty(len(gen_batch), dtype=object)
        for i in range(len(column)):
            column[i] = list(rows)
        gen_batch.non_tensor_batch[BATCH_ROWS] = column
        return gen_batch

    def _save_checkpoint(self):
        # verl checkpoints a step before it logs the step's metrics: a run killed in between
        # would resume past a step whose metrics line is lost. The save waits for the line.
        self._save_due = True

    def log_step(self, metrics, step: int) -> None:
        # verl's check that the engine samples the policy the actor trains: the largest gap
        # between vLLM's and the actor's probability of a sampled token (weight sync, kernels)
        gap = metrics.get("training/rollout_probs_diff_max")
        # one-step-off: rollout_seconds is the wait for the batch; the generation itself, which
        # ran beside the previous step's training, is generate_seconds
        overlapped = metrics.get("timing_s/generate_async")
        self.log.log({"step": int(step), **self._rollouts, "rollout_seconds": float(metrics["timing_s/gen"]),
                      "wall_seconds": float(metrics["timing_s/step"]), "devices": held_gpus(self.config),
                      **({} if gap is None else {"rollout_probs_diff_max": float(gap)}),
                      **({} if overlapped is None else {"generate_seconds": float(overlapped)}), **policy_stats(metrics)})
        if self._save_due:
            self._save_due = False
            super()._save_checkpoint()

    def init_workers(self):
        # verl builds its rollout replicas here (LLMServerManager) from rollout.name; the name stays
        # "vllm" (verl's workers and weight sync key on it) and loads the suite's server
        RolloutReplicaRegistry.register("vllm", suite_replica)
        super().init_workers()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        # a resumed run keeps the metrics of the steps its checkpoint holds, as the local trainer
        self.log.truncate_after(self.global_steps)

    def finish(self) -> None:
        """``final/`` from the last checkpoint's plain weights, written as the local trainer
        writes it (atomically, DONE.json last, with the weights' fingerprint)."""
        # verl saves on the last step (trainer.save_freq > 0); RL never changes the tokenizer
        weights = Path(find_latest_ckpt_path(self.config.trainer.default_local_dir)) / "actor" / "huggingface"
        model = AutoModelForCausalLM.from_pretrained(weights, dtype="auto")
        save_checkpoint(self.run_dir / "final", model, self.tokenizer, {"step": "final"})


class SuiteTrainer(SuiteSteps, RayPPOTrainer):
    """verl's synchronous trainer (``rl.async_training=none``): each step generates, then trains."""


class SuiteOneStepTrainer(SuiteSteps, OneStepOffRayTrainer):
    """verl's one-step-off-policy trainer (``rl.async_training=one_step_off``): step s+1's batch
    is generated on the rollout pool, by the weights of step s-1, while the actor trains step s."""

    _drawn = 0

    def batch_step(self) -> int:
        # batches are drawn one step ahead, while self.global_steps is still the step training
        self._drawn = max(self._drawn + 1, self.global_steps)
        return self._drawn


def suite_replica():
    """The replica running the suite's vLLM server (server.py), imported when verl asks for it:
    it needs vLLM, which only the GPU cluster has."""
    from cbpo.backends.verl.server import SuiteReplica

    return SuiteReplica


@ray.remote
class SuiteTaskRunner(BaseTaskRunner):
    """verl 0.9.1's ``TaskRunner`` (``main_ppo_v0``), building ``SuiteTrainer`` instead of
    ``RayPPOTrainer``: the workers, resource pools and datasets are verl's, from its config."""

    def run(self, config):
        OmegaConf.resolve(config)
        if config.actor_rollout_ref.hybrid_engine:
            trainer_cls = SuiteTrainer
            _, worker_group_cls = self.add_actor_rollout_worker(config)
            self.add_teacher_model_resource_pool(config)  # OPD's teacher pool (config.py); nothing otherwise
            pools = self.init_resource_pool_mgr(config)
        else:  # rl.async_training: the workers and pools as verl's one-step-off task runner makes them
            trainer_cls = SuiteOneStepTrainer
            self.role_worker_mapping, worker_group_cls = separate.create_role_worker_mapping(config)
            pools = separate.create_resource_pool_manager(config, self.role_worker_mapping.keys())
        model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        train, val = (create_rl_dataset(config.data.train_files, config.data, model.tokenizer, model.processor,
                                        is_train=is_train) for is_train in (True, False))
        verl_dir = Path(config.trainer.default_local_dir)  # config.py puts it inside the run folder
        cfg = OmegaConf.load(verl_dir / SUITE_CONFIG)
        trainer = trainer_cls(
            config=config, tokenizer=model.tokenizer, processor=model.processor,
            role_worker_mapping=self.role_worker_mapping, resource_pool_manager=pools,
            ray_worker_group_cls=worker_group_cls, train_dataset=train, val_dataset=val, collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train),
            method=build_method(cfg, vocab_size=len(model.tokenizer)), run_dir=verl_dir.parent,
            log=MetricsLog(verl_dir.parent / "metrics.jsonl", cfg.wandb, OmegaConf.to_container(cfg)),
        )
        trainer.init_workers()
        trainer.fit()


_GROUPS: dict[str, GroupRollouts] = {}  # per agent-loop worker process and run


def training_rows(train_files: str) -> list[dict]:
    """The run's training rows from the dataset the launch wrote for verl (``launch.write_inputs``),
    row i at its ``index`` i."""
    return [json.loads(info["row"]) for info in pd.read_parquet(train_files, columns=["extra_info"])["extra_info"]]


def group_rollouts(verl_dir: Path, train_files: str, tokenizer, generate, loop, budget: int) -> GroupRollouts:
    """The run's method, tools, rewarder and agent settings, built once per worker process from
    the run's config, as the local trainer builds them; the training rows where the method
    draws replacement problems from them."""
    cfg = OmegaConf.load(verl_dir / SUITE_CONFIG)
    method = build_method(cfg, vocab_size=len(tokenizer))
    rl = settings(cfg, "rl")
    if method.off_context_credit:
        # no model here: collect samples and flags leaked hints (decoding), the actor rescores
        registry.setup(method, None, tokenizer, rl.temperature)
    tools = environment_tools(cfg.data.tools, settings(cfg, "tools_cfg"), cfg.data.seed, cfg.data_root, cfg.data.tasks)
    rewarder = Rewarder()  # its verifier pool lives as long as the worker
    system_prompt = resolve_system_prompt(cfg.system_prompt)
    # K of Eq. 6 is the method's (CBPO's method.top_k); other methods keep the engine's default
    entropy_k = {"top_k_entropy": method.cfg.top_k} if hasattr(method.cfg, "top_k") else {}
    return GroupRollouts(
        method, tokenizer, tools, rl.agent,
        lambda uid: ServerEngine(generate, loop, uid, **entropy_k, temperature=rl.temperature),
        lambda question: build_prompt(tokenizer, question, system_prompt),
        lambda trajs, row: reward_rollouts(tokenizer, rewarder, trajs, [row] * len(trajs)),
        budget, training_rows(train_files) if registry.prompt_pool(method) > 1 else (), rl.seed)


@register(AGENT_LOOP)
class GroupAgentLoop(AgentLoopBase):
    """``cbpo_group``: one batch row of verl's agent loop, rollout k of its problem's group.

    verl builds one agent loop per row, so the rows of a problem (one uid, ``rollout.n`` rows,
    all in one worker: config.py's ``num_workers``) meet in the worker's ``GroupRollouts``. The
    row's data is the suite's row and its index in the training rows (``extra_info``, written by
    the launch); verl's sampling parameters are not used: the suite's engine sends its own
    (temperature ``rl.temperature``). The rollout may answer a replacement problem (DAPO): its
    prompt, reward and domain are that problem's, its uid the row's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        verl_dir = self.config.trainer.default_local_dir
        if verl_dir not in _GROUPS:
            _GROUPS[verl_dir] = group_rollouts(Path(verl_dir), self.config.data.train_files, self.tokenizer,
                                               self.server_manager.generate, self.loop, self.rollout_config.n)
        self.group = _GROUPS[verl_dir]

    async def run(self, sampling_params, **kwargs) -> AgentLoopOutput:
        info = kwargs["extra_info"]
        t, k, row, counts, (hinted, leaked) = await self.group.rollout(
            str(kwargs["uid"]), json.loads(info["row"]), int(info["index"]), int(kwargs[STEP]), list(kwargs[BATCH_ROWS]))
        if len(t.prompt_ids) > self.rollout_config.prompt_length:
            # verl's own loops left-truncate; the launch sizes the block to the rows' prompts
            # (launch.fit_prompt_length), so a longer one is a bug to name, not a prompt to cut
            raise ValueError(f"training row {info['index']}: its prompt has {len(t.prompt_ids)} tokens, more than "
                             f"verl's rollout.prompt_length={self.rollout_config.prompt_length}")
        return AgentLoopOutput(
            prompt_ids=t.prompt_ids, response_ids=t.response_ids, response_mask=[int(m) for m in t.model_mask],
            response_logprobs=t.logprobs, reward_score=t.reward, num_turns=2 * t.tool_calls + 2,
            metrics=AgentLoopMetrics(),
            extra_fields={**credit.rollout_fields(t, k, hinted, leaked), **rollout_stats(t, row), **search_fields(counts),
                          **group_fields(counts)},
        )
