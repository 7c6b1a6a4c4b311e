"""The RL loop shared by every method, on one machine: sample problems -> method.collect
(rollouts through the agent loop) -> outcome rewards -> method.credit (per-model-token
advantages) -> clipped surrogate + KL to a frozen reference (Eqs. 20-23) -> AdamW. A step
checkpoint is atomic and a run resumes from the last one."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from cbpo import registry
from cbpo.backends.local.state import resume, save_state
from cbpo.chat import SYSTEM_PROMPT, build_prompt
from cbpo.device import autocast
from cbpo.logprobs import rollout_tensors, token_logprobs, update_logprobs, update_tensors
from cbpo.objective import ObjectiveConfig, loss_normalisers, policy_objective
from cbpo.registry import Method
from cbpo.reward import reward_rollouts
from cbpo.rollout.agent import run_agent
from cbpo.rollout.engine import HFEngine
from cbpo.runlog import MetricsLog
from cbpo.stages import RLConfig
from cbpo.tools import step_search_stats
from cbpo.trajectory import Trajectory

# Loss parts that are shares of the whole batch's loss (they add up over micro-batches); the
# other metrics are token means within a micro-batch, averaged by its share of loss tokens.
_LOSS_SHARES = ("loss", "pg_loss", "kl")


def policy_update(model, ref_model, opt, trajs, credits, cfg: RLConfig, objective: ObjectiveConfig, pad_id: int,
                  dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Eq. 23 over all rollouts of the step: ``cfg.ppo_mini_batches`` optimiser steps, each on a
    disjoint mini-batch, in micro-batches. Each micro-batch's loss is aggregated with its
    mini-batch's loss-token count, sequence count and padded length (verl's ``agg_loss``
    arguments), so the micro-batch losses add up to the mini-batch's for every
    ``objective.loss_agg_mode``: the micro-batch size is memory only."""
    rows, plans = update_plan(trajs, credits, cfg)
    if not rows:
        return {"loss": 0.0, "skipped": 1.0}
    n_mini = len(rows)
    temp = cfg.temperature if cfg.temperature > 0 else 1.0  # greedy rollouts: score the plain policy

    # rl.shared_prefix: a micro-batch's rows with one prompt may run as one prefix tree, so what
    # they share (the prompt, a branch's copied prefix) is computed once; same log-probs and gradient.
    def tensors(idx):
        return update_tensors([trajs[i] for i in idx], [credits[i] for i in idx], pad_id, model.config, cfg.shared_prefix,
                              model.device)

    def logprobs(net, batch):
        with autocast(model.device, dtype):
            return update_logprobs(net, batch, temp)

    # pi_old is the policy that sampled the batch, recomputed (as verl's actor does) rather than
    # taken from the engine, whose log-probs are the untempered policy's. With one mini-batch it
    # is the current policy, so the update's own forward pass serves (detached).
    old = None
    if n_mini > 1:
        with torch.no_grad():
            old = [[logprobs(model, tensors(idx)) for idx in plan] for plan in plans]
    totals: dict[str, float] = {}
    for m, plan in enumerate(plans):
        batch_info = loss_normalisers(credits, rows[m], cfg.agent.max_total_tokens)
        opt.zero_grad(set_to_none=True)
        for u, idx in enumerate(plan):
            batch = tensors(idx)
            log_prob = logprobs(model, batch)
            ref = None
            if ref_model is not None and objective.beta > 0:
                with torch.no_grad():
                    ref = logprobs(ref_model, batch)
            loss, metrics = policy_objective(
                log_prob, log_prob.detach() if old is None else old[m][u], batch["advantages"], batch["loss_mask"],
                ref_log_prob=ref, objective=objective, **batch_info,
            )
            loss.backward()
            share = float(batch["loss_mask"].sum()) / batch_info["batch_num_tokens"]
            for k, v in {"loss": loss.item(), **metrics}.items():
                totals[k] = totals.get(k, 0.0) + (1.0 if k in _LOSS_SHARES else share) * float(v) / n_mini
        totals["grad_norm"] = totals.get("grad_norm", 0.0) + float(
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)) / n_mini
        opt.step()
    return totals

def update_plan(trajs, credits, cfg: RLConfig) -> tuple[list[list[int]], list[list[list[int]]]]:
    """``policy_update``'s rows of each mini-batch (every rollout, in ``cfg.ppo_mini_batches``
    strided shares) and its micro-batches (the rows with a loss token, ``cfg.micro_batch_size``
    at a time); none when no rollout has a loss token."""
    valid = [i for i, (_, m) in enumerate(credits) if np.any(m)]
    if not valid:
        return [], []
    # similar lengths share a micro-batch (less padding); striding keeps each mini-batch's mix
    valid.sort(key=lambda i: (len(trajs[i].prompt_ids), len(trajs[i].response_ids)))
    n_mini = min(cfg.ppo_mini_batches, len(valid))
    # rollouts without a loss token run no forward pass but count in their mini-batch's 1/M;
    # valid rows first, so every mini-batch has one to train
    idle = [i for i in range(len(trajs)) if not np.any(credits[i][1])]
    rows = [(valid + idle)[j::n_mini] for j in range(n_mini)]
    minis = [mini[: len(valid[j::n_mini])] for j, mini in enumerate(rows)]
    return rows, [[mini[s : s + cfg.micro_batch_size] for s in range(0, len(mini), cfg.micro_batch_size)] for mini in minis]

def fill_ref_kl(model, ref_model, trajs: Sequence[Trajectory], cfg: RLConfig, pad_id: int,
                dtype: torch.dtype = torch.float32) -> None:
    """Each rollout's ``ref_kl``: log pi_old - log pi_ref (k1) of its sampled tokens, for a method
    whose token reward carries the KL (``registry.reward_kl``, REINFORCE++). pi_old is the policy
    that sampled them, at the sampling temperature, as verl's ``old_log_probs`` and ``ref_log_prob``
    from which its ``apply_kl_penalty`` computes the same k1 KL; 0 on observation tokens."""
    temp = cfg.temperature if cfg.temperature > 0 else 1.0
    for s in range(0, len(trajs), cfg.micro_batch_size):
        chunk = trajs[s : s + cfg.micro_batch_size]
        batch = rollout_tensors(chunk, [(np.zeros(t.n_model_tokens), np.ones(t.n_model_tokens)) for t in chunk], pad_id,
                                model.device)
        with torch.no_grad(), autocast(model.device, dtype):
            kl = (token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["n_resp"], temp)
                  - token_logprobs(ref_model, batch["input_ids"], batch["attention_mask"], batch["n_resp"], temp))
        kl = (kl.float() * batch["loss_mask"]).cpu()  # the loss mask given here is the model-token mask
        for t, row in zip(chunk, kl):
            t.ref_kl = row[: len(t.response_ids)].tolist()

def stratified_pick(domains: Sequence[str], n: int, rng: np.random.Generator) -> list[int]:
    """``n`` distinct row indices, split as evenly as possible across domains (math/search),
    so one step's reward does not swing with its domain mix. Depends only on the rng."""
    by_domain: dict[str, list[int]] = {}
    for i, d in enumerate(domains):
        by_domain.setdefault(d, []).append(i)
    pools = [list(rng.permutation(idx)) for _, idx in sorted(by_domain.items())]
    pick: list[int] = []
    while len(pick) < n and any(pools):
        for pool in pools:
            if pool and len(pick) < n:
                pick.append(int(pool.pop()))
    return pick

def step_problems(domains: Sequence[str], step: int, per_step: int, pool_size: int | None, seed: int) -> list[int]:
    """Row indices of RL step ``step`` (0-based): epochs over the problem pool (every row, or a
    domain-balanced subset of ``pool_size``), each epoch in a fresh domain-balanced order, as a
    shuffling data loader would. Deterministic in (seed, step), so a resumed run continues the
    same stream."""
    pool = list(range(len(domains)))
    if pool_size is not None:
        pool = stratified_pick(domains, pool_size, np.random.default_rng([seed, 0]))
    pool_domains = [domains[i] for i in pool]
    picks: list[int] = []
    while len(picks) < per_step:
        epoch, offset = divmod(step * per_step + len(picks), len(pool))
        order = stratified_pick(pool_domains, len(pool), np.random.default_rng([seed, 1, epoch]))
        picks += [pool[i] for i in order[offset : offset + per_step - len(picks)]]
    return picks

def rl_train(
    model,
    tokenizer,
    method: Method,
    rows: Sequence[Mapping[str, Any]],
    tools: Mapping[str, Callable[[str], str]],
    rewarder: Callable[[Sequence[str], Sequence[Mapping[str, Any]]], list[float]],
    cfg: RLConfig,
    run_dir: Path,
    log: MetricsLog,
    system_prompt: str | None = SYSTEM_PROMPT,
    dtype: torch.dtype = torch.float32,
) -> None:
    """The RL loop on the model's device (the reference model and the tensors of each update
    follow it), forward passes in ``dtype``; rollouts from ``cfg.engine``."""
    if not rows:
        raise ValueError("RL needs at least one training row")
    if cfg.async_training != "none":
        raise ValueError(f"rl.async_training={cfg.async_training} is verl's trainer (backend=verl); the local trainer "
                         "generates and trains in turn (rl.async_training=none)")
    if cfg.pool_size is not None and not cfg.problems_per_step <= cfg.pool_size <= len(rows):
        raise ValueError(f"rl.pool_size={cfg.pool_size} must lie between problems_per_step={cfg.problems_per_step} "
                         f"and the {len(rows)} training rows")
    objective = method.cfg.objective()
    reward_kl = registry.reward_kl(method)  # REINFORCE++'s KL in the reward needs the reference model too
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if objective.beta > 0 or reward_kl > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    # K of Eq. 6 is the method's (CBPO's method.top_k); other methods keep the engine's K = 10.
    entropy_k = {"top_k_entropy": method.cfg.top_k} if hasattr(method.cfg, "top_k") else {}
    engine = rollout_engine(model, tokenizer, cfg, dtype, **entropy_k)
    sampler = getattr(engine, "generator", None)  # vLLM seeds once at start: its draws are not checkpointed
    registry.setup(method, model, tokenizer, cfg.temperature if cfg.temperature > 0 else 1.0)
    method_rng = getattr(method, "rng", None)  # a method's own draws resume exactly too
    start = resume(run_dir, model, opt, None, log, sampler=sampler, method_rng=method_rng)
    push_weights(engine, model)  # a resumed policy is not the checkpoint the engine loaded
    prompts = [build_prompt(tokenizer, r["question"], system_prompt) for r in rows]
    domains = [r.get("domain", "") for r in rows]
    # Methods that choose among more prompts than they train on (DAPO's dynamic sampling) are
    # offered prompt_pool batches of the step's size.
    offered_per_step = cfg.problems_per_step * registry.prompt_pool(method)

    def sample(trajs, follow_up=None):
        return run_agent(engine, tokenizer, trajs, tools, cfg.agent, follow_up)

    def encode(question):
        return build_prompt(tokenizer, question, system_prompt)
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"rl[{method.name}]", dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        pick = step_problems(domains, step, offered_per_step, cfg.pool_size, cfg.seed)
        offered = [rows[i] for i in pick]

        def score(groups, indices, offered=offered):
            reward_rollouts(tokenizer, rewarder, [t for g in groups for t in g], [offered[k] for k, g in zip(indices, groups) for _ in g])

        model.eval()
        counts_before = rollout_counts(engine)
        with torch.no_grad():
            groups = registry.collect(method, [prompts[i] for i in pick], sample, registry.Problems(offered, encode, score))
        t_roll = time.perf_counter() - t0
        counts = {k: v - counts_before[k] for k, v in rollout_counts(engine).items()}
        # an empty group is a prompt the method chose not to train on
        pick, groups = [i for i, g in zip(pick, groups) if g], [g for g in groups if g]
        flat = [t for g in groups for t in g]
        owner_rows = [rows[i] for i, g in zip(pick, groups) for _ in g]
        unscored = [k for k, t in enumerate(flat) if t.reward is None]
        reward_rollouts(tokenizer, rewarder, [flat[k] for k in unscored], [owner_rows[k] for k in unscored])
        if reward_kl > 0 and flat:
            fill_ref_kl(model, ref_model, flat, cfg, tokenizer.pad_token_id, dtype)
        credits = [c for g in method.credit(groups) for c in g] if groups else []
        model.train()
        stats = policy_update(model, ref_model, opt, flat, credits, cfg, objective, tokenizer.pad_token_id, dtype) if flat \
            else {"loss": 0.0, "skipped": 1.0}
        if flat:
            push_weights(engine, model)
        wall = time.perf_counter() - t0
        record = {
            "step": step + 1,
            "reward": float(np.mean([t.reward for t in flat])) if flat else float("nan"),
            **{f"reward/{d or 'none'}": float(np.mean([t.reward for t, r in zip(flat, owner_rows) if r.get("domain", "") == d]))
               for d in sorted({r.get("domain", "") for r in owner_rows})},
            "problems": len(groups),
            "rollouts": len(flat),
            "generated_tokens": sum(t.generated_tokens for t in flat),
            "tool_calls": sum(t.tool_calls - t.copied_tool_calls for t in flat),
            "tool_seconds": sum(t.tool_seconds for t in flat),
            "rollout_seconds": t_roll,
            "wall_seconds": wall,
            **{f"n_{k}": sum(t.kind == k for t in flat) for k in sorted({"parent", "branch", "fill"} | {t.kind for t in flat})},
            **counts,  # vLLM: the step's prompt tokens, those its prefix cache served (branch prefixes), engine steps
            **registry.step_stats(method),
            **step_search_stats(tools),  # searches, shared-cache hits and misses of this step
            **stats,
        }
        log.log(record)
        if cfg.dump_rollouts and ((step + 1) % cfg.dump_every == 0 or step + 1 == cfg.steps):
            info = getattr(method, "rollout_info", None)
            extra = [e for g in info(groups) for e in g] if info else [{}] * len(flat)
            texts = tokenizer.batch_decode([t.response_ids for t in flat], skip_special_tokens=False)
            dump_rollouts(run_dir / "rollouts" / f"step_{step + 1:06d}.jsonl", flat, texts, credits, owner_rows, extra)
        bar.set_postfix(reward=f"{record['reward']:.3f}", tok_s=f"{record['generated_tokens'] / max(t_roll, 1e-9):.0f}")
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_state(run_dir, step + 1, model, tokenizer, opt, None, sampler=sampler, method_rng=method_rng)

def rollout_engine(model, tokenizer, cfg: RLConfig, dtype: torch.dtype, **entropy_k):
    """``cfg.engine``: the HF engine samples with the policy itself on its device; vLLM loads
    the checkpoint the policy came from (``name_or_path``) and gets the policy's weights from
    ``push_weights``."""
    if cfg.engine == "hf":
        return HFEngine(model, tokenizer, **entropy_k, temperature=cfg.temperature, device=model.device, generator=cfg.seed)
    from cbpo.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model.name_or_path, tokenizer, **entropy_k, temperature=cfg.temperature, seed=cfg.seed,
                      gpu_memory_utilization=cfg.vllm_gpu_memory, admission=cfg.vllm_admission,
                      llm_kwargs={"dtype": str(dtype).removeprefix("torch.")})

def rollout_counts(engine) -> dict[str, int]:
    """The engine's running prefill and step counts (``VLLMEngine.rollout_counts``); none for
    the HF engine, whose prefix reuse is its own KV copies."""
    return engine.rollout_counts() if hasattr(engine, "rollout_counts") else {}

def push_weights(engine, model) -> None:
    """An engine with its own copy of the weights (vLLM) samples the next step from the
    policy as updated; the HF engine shares the policy's weights and needs nothing."""
    if hasattr(engine, "push_weights"):
        engine.push_weights(model.named_parameters())

def dump_rollouts(path: Path, trajs, texts, credits, rows, extra) -> None:
    """One JSON line per rollout: text and tokens, model/observation mask, per-token entropy and
    log-prob of the sampled token (the engine's, 0.0 on observation tokens), reward, token
    advantages and loss mask, plus the method's own annotations (CBPO: candidate windows,
    priorities, chosen nodes and their CBV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t, text, (a, m), row, more in zip(trajs, texts, credits, rows, extra):
            f.write(json.dumps({
                "problem": row["id"], "kind": t.kind, "parent": t.parent, "at": t.at, "reward": t.reward,
                "text": text, "response_ids": t.response_ids, "model_mask": [int(x) for x in t.model_mask],
                "entropy": [round(e, 5) for e in t.entropies], "logprob": [round(lp, 5) for lp in t.logprobs],
                "advantage": np.asarray(a).round(6).tolist(),
                "loss_mask": np.asarray(m).astype(int).tolist(), "tool_calls": t.tool_calls, "finish": t.finish,
                **more,
            }) + "\n")
