"""AEPO [PARTIAL]: entropy pre-monitoring, penalised branching, entropy-aware advantage
(arXiv 2510.14545 as BASELINES.md section 10 gives it)."""
from collections import Counter

import numpy as np
import pytest

from baselines.aepo import AEPO, AEPOConfig, entropy_aware, global_samples
from baselines.arpo import branch_probability
from cbpo.registry import get_method
from cbpo.trajectory import Trajectory

LOG_V = np.log(100)


def stepwise(root: float, tool: float):
    """Token entropies making each 10-token step's ARPO entropy (sum / ln 100) root, then tool."""
    return lambda pos: (root if pos < 10 else tool) * LOG_V / 10


@pytest.mark.parametrize(
    "tool, m",
    [
        (1.0, 8),  # H_root - H_tool = 0: m = 16 sigmoid(0) = 8
        (1.0 + np.log(3), 4),  # sigmoid(-ln 3) = 1/4 -> 4
        (1.0 - np.log(3), 12),  # sigmoid(ln 3) = 3/4 -> 12
        (1.0 + np.log(15), 4),  # 16 / 16 = 1, clamped up to global_min 4
        (1.0 - np.log(7), 12),  # 16 * 7/8 = 14, clamped down to global_max 12
    ],
)
def test_pre_monitoring_splits_the_budget(fake_agent, tool, m):
    chains = fake_agent(unique_ids=True, entropy=stepwise(1.0, tool))([Trajectory(prompt_ids=[1]) for _ in range(4)])
    assert global_samples(chains, AEPOConfig(), 100) == m


def test_no_tool_call_to_monitor_keeps_most_slots_global(fake_agent):
    chains = fake_agent(unique_ids=True, tools_at=())([Trajectory(prompt_ids=[1]) for _ in range(4)])
    assert global_samples(chains, AEPOConfig(), 100) == 12


def test_branch_penalty_decays_with_consecutive_branch_steps():
    # P = clip(tau + gamma_H dH, 0, 1) (1 - lambda)^l: 1 * 0.5^2 = 0.25; 0.7 * 0.5 = 0.35.
    assert branch_probability(0.0, 1.0, 0.2, penalty=0.5, streak=2) == pytest.approx(0.25)
    assert branch_probability(1.0, 0.5, 0.2, penalty=0.5, streak=1) == pytest.approx(0.35)


def test_entropy_aware_advantage_matches_hand_worked_values():
    # Entropies 0, 2 | 1: mean 1, population std sqrt(2/3) -> z = -1.2247, +1.2247 | 0.
    # alpha = 0.2: factors 0.75505, 1.24495 | 1; alpha = 1: clipped to 0.5, 1.5 | 1.
    adv, ent = [np.array([1.0, 1.0]), np.array([-1.0])], [np.array([0.0, 2.0]), np.array([1.0])]
    low, high = 1 - 0.2 * np.sqrt(1.5), 1 + 0.2 * np.sqrt(1.5)
    out = entropy_aware(adv, ent, 0.2)
    np.testing.assert_allclose(out[0], [low, high], atol=1e-5)
    np.testing.assert_allclose(out[1], [-1.0])
    out = entropy_aware(adv, ent, 1.0)
    np.testing.assert_allclose(out[0], [0.5, 1.5])


@pytest.mark.parametrize("penalty, kinds", [(1.0, {"parent": 4, "branch": 4, "fill": 8}), (0.0, {"parent": 4, "branch": 12})])
def test_collect_monitors_then_branches_with_the_penalty(fake_agent, exact_branches, penalty, kinds):
    # Post-tool steps more uncertain than the first: m = 4 global chains (the monitoring pass
    # itself), 12 slots for branches, tau = 1. lambda = 1: a path that branched at token 10 may
    # not branch at 20 (its branches inherit the streak), so 4 branches and 8 fillers. lambda = 0:
    # every chain branches at 10 and 20, the branches at 10 again at 20: 4 + 8 + 4 = 16.
    agent = fake_agent(unique_ids=True, entropy=stepwise(1.0, 1.0 + np.log(3)))
    method = AEPO(vocab_size=100, branch_probability=1.0, branch_penalty=penalty)
    (g,) = method.collect([[1]], agent)
    assert agent.calls[0] == ["parent"] * 4 and len(g) == 16
    assert Counter(t.kind for t in g) == kinds
    exact_branches(g)


def test_collect_adds_the_global_chains_the_monitor_asks_for(fake_agent):
    agent = fake_agent(unique_ids=True)  # flat entropy: m = 8, so 4 more global chains after the 4 monitored
    groups = AEPO(vocab_size=100, branch_probability=0.0, entropy_weight=0.0).collect([[1], [2]], agent)
    assert agent.calls == [["parent"] * 8, ["parent"] * 8, ["fill"] * 16]
    assert [Counter(t.kind for t in g) for g in groups] == [{"parent": 8, "fill": 8}] * 2


def test_credit_scales_grpo_advantages_by_token_entropy(fake_agent):
    agent = fake_agent(unique_ids=True, length=4, tools_at=(), entropy=lambda pos: float(pos))
    group = agent([Trajectory(prompt_ids=[1]) for _ in range(2)])
    group[0].reward, group[1].reward = 1.0, 0.0
    (a0, m0), (a1, m1) = get_method("aepo")(vocab_size=100, advantage_entropy_weight=0.0).credit([group])[0]
    np.testing.assert_allclose(a0, np.sqrt(0.5), atol=1e-5)  # alpha = 0: plain GRPO
    (b0, _), (b1, _) = AEPO(vocab_size=100).credit([group])[0]
    # Entropies 0..3 in both rows: z = (e - 1.5) / sqrt(1.25); b = a clip(1 + 0.2 z, 0.5, 1.5).
    np.testing.assert_allclose(b0, a0 * (1 + 0.2 * (np.arange(4) - 1.5) / np.sqrt(1.25)), atol=1e-5)
    np.testing.assert_allclose(b1, -b0, atol=1e-5)
    assert m0.all() and m1.all()


def test_objective_defaults_are_the_stand_in_clip_bounds():
    cfg = AEPO(vocab_size=100).cfg.objective()
    assert (cfg.clip_low, cfg.clip_high) == (0.2, 0.28)


def test_the_entropy_clipping_balanced_loss_keeps_the_gradient_of_tokens_past_the_upper_clip():
    # Issue 24.6, AEPO's code: the value is vanilla PPO's (dual-clip included); a token with A > 0
    # whose ratio passed 1 + 0.28 still passes gradient -(1 + 0.28) A (token-mean over 4 tokens),
    # where vanilla's clip stops it. The other tokens' gradients are vanilla's.
    import torch

    from cbpo.objective import ObjectiveConfig, policy_objective

    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64))
    ratios = torch.tensor([[1.5, 1.1, 0.5, 4.0]], dtype=torch.float64)  # past the upper clip, inside, below, dual
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    cfg = AEPO(vocab_size=100).cfg.objective()
    assert cfg.policy_loss == "aepo_entropy_balanced_clip"
    out = {}
    for name, objective in (("aepo", cfg), ("vanilla", ObjectiveConfig(clip_low=0.2, clip_high=0.28, beta=0.0,
                                                                       loss_agg_mode=cfg.loss_agg_mode))):
        logp = (old + torch.log(ratios)).requires_grad_()
        loss, metrics = policy_objective(logp, old, adv, mask, objective=objective)
        (grad,) = torch.autograd.grad(loss, logp)
        out[name] = loss.item(), grad[0], metrics
    assert out["aepo"][0] == pytest.approx(out["vanilla"][0], rel=1e-12)
    assert out["vanilla"][1][0] == 0.0 and out["aepo"][1][0].item() == pytest.approx(-1.28 / 4)
    torch.testing.assert_close(out["aepo"][1][1:], out["vanilla"][1][1:])
    assert out["aepo"][2]["pg_clipfrac"] == out["vanilla"][2]["pg_clipfrac"]
