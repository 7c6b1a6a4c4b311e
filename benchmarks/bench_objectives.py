"""How far GSPO's, DAPO's and OC-GRPO's updates lie from GRPO's on one batch (issue #24.1): each
method's credit and objective, with the tiny preset's settings (4 PPO mini-batches per rollout
batch), one ``policy_update`` from the same policy on the same rollouts. Prints, per method, the
largest and the relative size of its weight change minus GRPO's, its loss and clip fraction.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_objectives.py [--model runs/tiny/tiny/mix/seed0/sft/final]

The batch: 8 problems x 16 rollouts of random tokens (8-30 model tokens, a 4-token tool
observation in half of them), rewards Bernoulli(p) with p from 0 to 0.9 by problem, fixed by the
seed; where a group's first half all failed its second half wins with p = 0.5, and for OC-GRPO
that half is privileged, its hinted prompt the prompt
plus 4 hint tokens, its importance weights from the policy's own log-probs with and without
them (``OCGRPO.model_logprobs``). The model is the demo's SFT checkpoint, else the prepared tiny
model (``models/tiny``, made by the DAG's first job).
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cbpo import schema
from cbpo.models import load_model
from cbpo.registry import get_method
from cbpo.backends.local.rl import policy_update
from cbpo.trajectory import Trajectory

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHODS = ("grpo", "gspo", "dapo", "oc_grpo")
P_WIN = (0.0, 0.0, 0.1, 0.3, 0.5, 0.5, 0.7, 0.9)  # each problem's chance that a rollout wins


def batch(rng: np.random.Generator, vocab: int) -> tuple[list[list[Trajectory]], list[list[int]]]:
    groups, prompts = [], []
    for p_win in P_WIN:
        prompt = [int(t) for t in rng.integers(5, vocab, 6)]
        group = []
        for _ in range(16):
            n = int(rng.integers(8, 30))
            ids = [int(t) for t in rng.integers(5, vocab, n)]
            mask = [True] * n
            if rng.random() < 0.5:
                cut = int(rng.integers(2, n - 2))
                ids[cut:cut] = [int(t) for t in rng.integers(5, vocab, 4)]
                mask[cut:cut] = [False] * 4
            group.append(Trajectory(prompt, ids, mask, [0.0] * len(ids), [0.5 if m else 0.0 for m in mask],
                                    finish="answer", tool_calls=int(not all(mask)), reward=float(rng.random() < p_win)))
        if not any(t.reward for t in group[:8]):  # OC-GRPO hints these: its hinted half wins half the time
            for t in group[8:]:
                t.reward = float(rng.random() < 0.5)
        groups.append(group)
        prompts.append(prompt)
    return groups, prompts


def privileged(method, groups, prompts, rng, model, tokenizer, temperature) -> None:
    """OC-GRPO's collect on a fixed batch: the second half of every all-failed group is privileged."""
    half = method.cfg.budget // 2
    method.setup(model, tokenizer, temperature)
    method.last_hinted = [{} for _ in groups]
    for x, g in enumerate(groups):
        if max(t.reward for t in g[:half]) < method.cfg.hint_threshold:
            hinted = prompts[x] + [int(t) for t in rng.integers(5, len(tokenizer), 4)]
            for k in range(half, len(g)):
                g[k].kind = "privileged"
                method.last_hinted[x][k] = hinted
    method.off_context(method.model_logprobs(groups), [set() for _ in groups])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("runs/tiny/tiny/mix/seed0/sft/final"),
                        help="a checkpoint folder (default: the demo's SFT; models/tiny where it is missing)")
    args = parser.parse_args()
    torch.manual_seed(0)
    source = args.model if args.model.is_dir() else Path("models/tiny")
    policy, tokenizer = load_model(source)
    schema.register()
    start = torch.cat([p.detach().flatten() for p in policy.parameters()])
    deltas, stats = {}, {}
    for name in METHODS:
        with initialize_config_dir(str(CONFIGS), version_base=None):
            cfg = compose("config", overrides=["preset=tiny", f"method={name}"])
        params = OmegaConf.to_container(cfg.method, resolve=True)
        rl, method = schema.settings(cfg, "rl"), get_method(params.pop("name"))(len(tokenizer), **params)
        rng = np.random.default_rng(0)
        groups, prompts = batch(rng, len(tokenizer))
        if name == "oc_grpo":
            privileged(method, groups, prompts, rng, policy, tokenizer, rl.temperature)
        flat = [t for g in groups for t in g]
        credits = [c for g in method.credit(groups) for c in g]
        model = copy.deepcopy(policy).train()
        opt = torch.optim.AdamW(model.parameters(), lr=rl.lr, weight_decay=rl.weight_decay)
        stats[name] = policy_update(model, None, opt, flat, credits, rl, method.cfg.objective(), tokenizer.pad_token_id)
        stats[name]["privileged"] = sum(t.kind == "privileged" for t in flat)
        deltas[name] = torch.cat([p.detach().flatten() for p in model.parameters()]) - start
    print(f"model: {source}; tiny preset: rl.ppo_mini_batches={rl.ppo_mini_batches}, lr={rl.lr}; 128 rollouts")
    print("| method | max abs(dtheta - dtheta_GRPO) | norm(dtheta - dtheta_GRPO) / norm(dtheta_GRPO) | loss | pg_clipfrac | privileged |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = deltas["grpo"]
    for name in METHODS:
        diff = deltas[name] - base
        s = stats[name]
        print(f"| {name} | {diff.abs().max():.3e} | {diff.norm() / base.norm():.3f} | {s['loss']:.4f} | "
              f"{s.get('pg_clipfrac', float('nan')):.3f} | {s['privileged']} |")


if __name__ == "__main__":
    main()
