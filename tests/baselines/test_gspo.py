"""GSPO (arXiv 2507.18071): the sequence-level clipped objective through verl's gspo loss."""
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from baselines.gspo import GSPO
from cbpo.objective import policy_objective


def gspo_objective(logp, old, adv, mask, low, high):
    """Sec. 4.1: s_i = exp(mean_t log r_it) over model tokens; J = mean_i min(s A, clip(s) A)."""
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    a = adv[:, 0]
    return torch.minimum(s * a, torch.clamp(s, 1 - low, 1 + high) * a).mean()


def test_hand_worked_sequence_ratio_is_clipped_as_a_whole():
    # Row 0: log r = 0.001, 0.0008 on its 2 model tokens (the third is an observation), so
    # s = exp(0.0009) = 1.0009004 > 1 + 4e-4: with A = 1 the clipped 1.0004 is taken.
    # Row 1: s = exp(-0.0001) = 0.9999, inside [1 - 3e-4, 1 + 4e-4]: A = -2 gives -1.9998.
    logp = torch.tensor([[-1.0 + 0.001, -2.0 + 0.0008, -0.5], [-1.0 - 0.0001, -1.0 - 0.0001, -1.0 - 0.0001]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    cfg = GSPO().cfg
    loss, _ = policy_objective(logp, old, adv, mask, objective=cfg.objective())
    expected = -(1.0004 + -2 * np.exp(-0.0001)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-7)  # verl's token mean adds 1e-8 to |y_i|


def test_verl_gspo_loss_equals_the_papers_objective_on_random_inputs():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 7, generator=g, dtype=torch.float64)
    old = logp + 1e-3 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    adv = torch.randn(5, 1, generator=g, dtype=torch.float64).expand(5, 7)  # one advantage per sequence
    mask = (torch.rand(5, 7, generator=g) > 0.3).double()
    mask[:, 0] = 1
    cfg = GSPO().cfg
    loss, _ = policy_objective(logp, old, adv, mask, objective=cfg.objective())
    assert loss.item() == pytest.approx(-gspo_objective(logp, old, adv, mask, 3e-4, 4e-4).item(), rel=1e-7)


def test_credit_is_grpos_group_advantage(trajectory):
    group = [trajectory([2], 1.0), trajectory([3, (7,), 1], 0.0)]
    (a0, m0), (a1, m1) = GSPO(budget=2).credit([group])[0]
    s = 1 / (np.sqrt(0.5) + 1e-6) * 0.5
    np.testing.assert_allclose(a0, [s, s]) and np.testing.assert_allclose(a1, [-s] * 4)
    assert m0.all() and m1.all()


def test_under_the_tiny_preset_gspo_clips_and_trains_otherwise_than_grpo(tokenizer, policy):
    # Issue 24.1: with one optimiser step per rollout batch pi_theta = pi_old at the gradient,
    # so GSPO's update was GRPO's to the last bit. The tiny preset's mini-batches move the ratio.
    from hydra import compose, initialize_config_dir

    from cbpo import schema
    from omegaconf import OmegaConf

    from cbpo.registry import get_method
    from cbpo.backends.local.rl import policy_update
    from cbpo.trajectory import Trajectory

    rng = np.random.default_rng(0)
    trajs = []
    for _ in range(8):
        prompt = [int(t) for t in rng.integers(5, 200, 6)]
        for _ in range(16):
            n = int(rng.integers(8, 30))
            trajs.append(Trajectory(prompt, [int(t) for t in rng.integers(5, 200, n)], [True] * n, [0.0] * n, [0.5] * n,
                                    finish="answer", reward=float(rng.random() < 0.4)))
    schema.register()
    weights, stats = {}, {}
    for name in ("grpo", "gspo"):
        with initialize_config_dir(str(Path(__file__).resolve().parents[2] / "configs"), version_base=None):
            cfg = compose("config", overrides=["preset=tiny", f"method={name}"])
        params = OmegaConf.to_container(cfg.method, resolve=True)
        rl, method = schema.settings(cfg, "rl"), get_method(params.pop("name"))(len(tokenizer), **params)
        credits = [c for g in method.credit([trajs[i:i + 16] for i in range(0, len(trajs), 16)]) for c in g]
        model = copy.deepcopy(policy).train()
        opt = torch.optim.AdamW(model.parameters(), lr=rl.lr, weight_decay=rl.weight_decay)
        stats[name] = policy_update(model, None, opt, trajs, credits, rl, method.cfg.objective(), tokenizer.pad_token_id)
        weights[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (weights["gspo"] - weights["grpo"]).abs().max() > 1e-4
    assert stats["grpo"]["pg_clipfrac"] == 0.0 and stats["gspo"]["pg_clipfrac"] > 0.1
