"""REINFORCE++ (arXiv 2501.03262): the k1 KL in the token reward, gamma 1, returns whitened over
the batch's model tokens; and REINFORCE++-baseline (reward minus group mean, whitened the same
way). Checked by hand, against verl on the multi-turn layout, and through the method."""
import numpy as np
import pytest
import torch

from baselines.reinforce_pp import ReinforcePP, reinforce_pp_advantages
from cbpo import registry


def zeros(n_tokens):
    return [[np.zeros(n) for n in g] for g in n_tokens]


def test_hand_worked_group_mean_then_token_weighted_whitening():
    # Groups (1, 0) and (1, 1, 0) with 1, 3 | 2, 2, 4 model tokens.
    # Centred: 0.5, -0.5 | 1/3, 1/3, -2/3. Token-weighted mean over 12 tokens:
    # (0.5 - 1.5 + 2/3 + 2/3 - 8/3) / 12 = -7/36. Unbiased token variance:
    # sum n (c - m)^2 / 11 with c - m = 25/36, -11/36, 19/36, 19/36, -17/36.
    c = np.array([0.5, -0.5, 1 / 3, 1 / 3, -2 / 3])
    n = np.array([1, 3, 2, 2, 4])
    m = -7 / 36
    var = (1 * (25 / 36) ** 2 + 3 * (11 / 36) ** 2 + 2 * (19 / 36) ** 2 * 2 + 4 * (17 / 36) ** 2) / 11
    expected = (c - m) / np.sqrt(var + 1e-8)
    assert np.sum(n * (c - m) ** 2) / 11 == pytest.approx(var)
    out = reinforce_pp_advantages([[1.0, 0.0], [1.0, 1.0, 0.0]], zeros([[1, 3], [2, 2, 4]]), 0.0, baseline=True)
    np.testing.assert_allclose([a[0] for g in out for a in g], expected, rtol=1e-9)
    assert all(np.ptp(a) == 0 for g in out for a in g)


def test_hand_worked_plain_returns_carry_the_kl_penalty_then_whiten_over_the_batch():
    # Two rollouts, no per-prompt baseline: R = 1 with KL (0.5, 1.0), R = 0 with KL (2.0,), beta 0.1.
    # Returns A_t = R - beta sum_{s>=t} KL_s: 1 - 0.15 = 0.85, 1 - 0.1 = 0.9 | -0.2.
    returns = np.array([0.85, 0.9, -0.2])
    expected = (returns - returns.mean()) / np.sqrt(returns.var(ddof=1) + 1e-8)
    out = reinforce_pp_advantages([[1.0, 0.0]], [[np.array([0.5, 1.0]), np.array([2.0])]], 0.1)
    np.testing.assert_allclose(np.concatenate(out[0]), expected, rtol=1e-7)
    # the baseline variant on the same batch: one value per rollout, the KL summed into its reward
    base = reinforce_pp_advantages([[1.0, 0.0]], [[np.array([0.5, 1.0]), np.array([2.0])]], 0.1, baseline=True)
    assert np.ptp(base[0][0]) == 0 and not np.allclose(np.concatenate(base[0]), expected)


def test_plain_multi_turn_rollouts_match_verl_on_the_full_layout():
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_reinforce_plus_plus_outcome_advantage

    # Response layouts, 1 = model token, 0 = observation (tool output) or padding; verl's batch
    # after apply_kl_penalty: -beta KL on model tokens, the outcome reward on the last response token.
    layouts = [[1, 1, 0, 0, 1, 1, 1], [1, 0, 0, 0, 1, 0, 0], [1, 1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 0, 0, 0]]
    rewards = [1.0, 0.0, 0.3, 0.8]
    beta = 0.05
    mask = torch.tensor(layouts, dtype=torch.float64)
    kl = torch.from_numpy(np.random.default_rng(0).normal(0.0, 1.0, mask.shape)) * mask
    token_rewards = -beta * kl
    for row, layout in enumerate(layouts):
        token_rewards[row, max(i for i, m in enumerate(layout) if m)] += rewards[row]
    verl_adv, _ = compute_reinforce_plus_plus_outcome_advantage(token_rewards, mask, AlgoConfig(gamma=1.0))
    kls = [kl[row][mask[row] == 1].numpy() for row in range(4)]
    ours = [a for g in reinforce_pp_advantages([rewards[:2], rewards[2:]], [kls[:2], kls[2:]], beta) for a in g]
    for row, a in enumerate(ours):
        np.testing.assert_allclose(verl_adv[row][mask[row] == 1].numpy(), a, rtol=1e-9)  # every turn sees R


def test_credit_reads_each_rollouts_ref_kl_and_trains_every_model_token(trajectory):
    group = [trajectory([2, (7, 7), 2], 1.0), trajectory([3], 0.0)]
    method = ReinforcePP(vocab_size=100)
    assert registry.reward_kl(method) == method.cfg.kl_coef == 0.001 and method.cfg.beta == 0.0
    with pytest.raises(ValueError, match="ref_kl"):
        method.credit([group])  # the trainer must fill it
    group[0].ref_kl = [3.0, 0.0, 9.0, 9.0, 0.0, 0.0]  # observations carry no KL (9.0 is ignored)
    group[1].ref_kl = [0.0, 0.0, 0.0]
    (a0, m0), (a1, m1) = method.credit([group])[0]
    assert len(a0) == 4 and m0.all() and m1.all() and a0[0] > 0 > a1[0]
    assert a0[0] < a0[1] == a0[3]  # a token's KL lowers its own return and no later token's


def test_the_baseline_variant_needs_no_reference_kl(trajectory):
    method = ReinforcePP(vocab_size=100, baseline=True, kl_coef=0.0, beta=0.001)
    assert registry.reward_kl(method) == 0.0 and method.cfg.kl_estimator == "mse"
    (a0, _), (a1, _) = method.credit([[trajectory([2, (7, 7), 2], 1.0), trajectory([3], 0.0)]])[0]
    assert np.ptp(a0) == 0 and np.ptp(a1) == 0 and a0[0] > 0 > a1[0]


def test_the_variant_named_in_the_workflow_is_the_baseline_form():
    from pathlib import Path

    import yaml

    variant = yaml.safe_load((Path(__file__).resolve().parents[2] / "workflow" / "config.yaml").read_text())["variants"]["reinforce_pp-baseline"]
    method = ReinforcePP(vocab_size=100, **variant["overrides"])
    assert variant["method"] == "reinforce_pp" and method.cfg.baseline and method.cfg.beta > 0 == registry.reward_kl(method)


def test_a_batch_without_two_model_tokens_gets_zero_advantage():
    out = reinforce_pp_advantages([[1.0, 0.0]], zeros([[1, 0]]), 0.001)
    assert [a.tolist() for a in out[0]] == [[0.0], []]
