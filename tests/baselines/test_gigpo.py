"""GiGPO: episode + anchor-state step advantages (arXiv 2505.10978, section 4)."""
import numpy as np
import pytest

from baselines.gigpo import GiGPO
from cbpo import registry
from cbpo.registry import get_method

X, Y = (7, 7), (8,)  # two different tool observations


def test_credit_matches_hand_worked_episode_and_step_groups(trajectory):
    # gamma = 0.5, omega = 1. Steps (model turns) and their anchors:
    #   t0 = [2 tok] X [2 tok], R=1: step 0 (prompt) return 0.5, step 1 (X) return 1
    #   t1 = [2 tok] X [1 tok], R=0: step 0 return 0,            step 1 (X) return 0
    #   t2 = [1 tok] Y [2 tok] X [1 tok], R=1: step 0 return 0.25, step 1 (Y) 0.5, step 2 (X) 1
    # Episode: R = 1,0,1, mean 2/3, sample std sqrt(1/3) -> A^E = s, -2s, s with s = sqrt(1/3).
    # Anchor "prompt": 0.5, 0, 0.25 -> mean 0.25, std 0.25 -> +1, -1, 0.
    # Anchor X: 1, 0, 1 -> s, -2s, s (as the episode). Anchor Y: a singleton -> 0.
    s = np.sqrt(1 / 3)
    group = [trajectory([2, X, 2], 1.0), trajectory([2, X, 1], 0.0), trajectory([1, Y, 2, X, 1], 1.0)]
    method = GiGPO(vocab_size=100, gamma=0.5, step_advantage_w=1.0)
    (a0, m0), (a1, m1), (a2, m2) = method.credit([group])[0]
    np.testing.assert_allclose(a0, [s + 1, s + 1, s + s, s + s], atol=1e-5)
    np.testing.assert_allclose(a1, [-2 * s - 1, -2 * s - 1, -2 * s - 2 * s], atol=1e-5)
    np.testing.assert_allclose(a2, [s + 0, s + 0, s + 0, s + s], atol=1e-5)
    assert m0.all() and m1.all() and m2.all()


def test_step_weight_zero_is_grpo_and_mean_norm_drops_the_std(trajectory):
    group = [trajectory([2, X, 2], 1.0), trajectory([2, X, 1], 0.0), trajectory([1, Y, 2, X, 1], 1.0)]
    grpo_like = GiGPO(vocab_size=100, step_advantage_w=0.0).credit([group])[0]
    s = np.sqrt(1 / 3)
    for (a, _), expected in zip(grpo_like, [s, -2 * s, s]):
        np.testing.assert_allclose(a, expected, atol=1e-5)
    # mean_norm, omega = 0: R - mean = 1/3, -2/3, 1/3.
    centred = GiGPO(vocab_size=100, step_advantage_w=0.0, mode="mean_norm").credit([group])[0]
    for (a, _), expected in zip(centred, [1 / 3, -2 / 3, 1 / 3]):
        np.testing.assert_allclose(a, expected)


def test_collect_samples_budget_independent_rollouts_in_one_call(fake_agent):
    agent = fake_agent(unique_ids=True)
    method = get_method("gigpo")(vocab_size=100, budget=4)
    groups = registry.collect(method, [[1, 2], [3]], agent, None)  # the default collect
    assert agent.calls == [["parent"] * 8]
    assert [len(g) for g in groups] == [4, 4]
    for g in groups:
        for t, r in zip(g, [1.0, 0.0, 0.0, 1.0]):
            t.reward = r
    for g, credit in zip(groups, method.credit(groups)):
        assert [len(a) for a, _ in credit] == [t.n_model_tokens for t in g]


def test_unknown_and_bad_keys_are_named():
    with pytest.raises(ValueError, match="unknown GiGPOConfig key.*omega"):
        GiGPO(vocab_size=100, omega=1.0)
    with pytest.raises(ValueError, match="mode"):
        GiGPO(vocab_size=100, mode="median")
