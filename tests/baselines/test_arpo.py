"""ARPO: entropy-based adaptive rollout at tool steps, GRPO with soft attribution (arXiv 2507.19849)."""
from collections import Counter

import numpy as np
import pytest

from baselines.agent_steps import step_starts
from baselines.arpo import ARPO, branch_probability, decision_points, step_entropy
from cbpo.registry import get_method
from cbpo.trajectory import Trajectory

OBS = (7, 7)
LOG_V = np.log(100)


def test_step_entropy_sums_the_first_k_tokens_over_log_vocab(fake_agent):
    # Steps [0, 10), [10, 20), [20, 30) with token entropies 0.1, 0.3, 0.1. With k = 4:
    # H = 0.4 / ln 100, 1.2 / ln 100, 0.4 / ln 100; with k = 20 a step has only its 10 tokens.
    t = fake_agent(unique_ids=True, entropy=lambda pos: 0.3 if 10 <= pos < 20 else 0.1)([Trajectory(prompt_ids=[1])])[0]
    np.testing.assert_allclose(step_entropy(t, step_starts(t), 4, 100), np.array([0.4, 1.2, 0.4]) / LOG_V)
    np.testing.assert_allclose(step_entropy(t, step_starts(t), 20, 100), np.array([1.0, 3.0, 1.0]) / LOG_V)
    # Decisions after each tool result: at 10, dH = H_0 - H_0 = 0; at 20, dH = H_1 - H_0 = 0.8 / ln 100.
    (b1, d1), (b2, d2) = decision_points(t, 4, 100)
    assert (b1, b2) == (10, 20) and d1 == 0.0 and d2 == pytest.approx(0.8 / LOG_V)
    # P = clip(tau + beta dH, 0, 1) = 0.5 + 0.2 * 0.8 / ln 100 = 0.53474.
    assert branch_probability(d2, 0.5, 0.2) == pytest.approx(0.534743, abs=1e-6)
    assert branch_probability(5.0, 0.5, 0.2) == 1.0 and branch_probability(-5.0, 0.5, 0.2) == 0.0
    # A branch at 20 measures from its own first step: no decision point of its own.
    assert decision_points(t.branch_prefix(20, 0), 4, 100) == []


def test_always_branching_spends_the_slots_in_tool_step_order(fake_agent, exact_branches):
    agent = fake_agent(unique_ids=True)
    groups = ARPO(vocab_size=100, branch_probability=1.0).collect([[1], [2]], agent)
    # 8 chains each decide at token 10 first: 8 branches fill the 16 slots; nothing is left.
    assert agent.calls == [["parent"] * 16, ["branch"] * 16]
    for g in groups:
        assert len(g) == 16
        assert [(t.parent, t.at) for t in g[8:]] == [(k, 10) for k in range(8)]
        exact_branches(g)


def test_branches_branch_again_and_unused_slots_are_filled(fake_agent, exact_branches):
    agent = fake_agent(unique_ids=True)
    groups = ARPO(vocab_size=100, initial_rollouts=2, branch_probability=1.0).collect([[1]], agent)
    # Phase 1: chains 0, 1 branch at 10 (round 1), then at 20 (round 2) -> rollouts 2..5.
    # Phase 2: the branches at 10 (2, 3) decide at 20 -> 6, 7; those at 20 have no tool step left.
    # 8 slots remain: fresh rollouts.
    assert agent.calls == [["parent"] * 2, ["branch"] * 4, ["branch"] * 2, ["fill"] * 8]
    (g,) = groups
    assert [(t.parent, t.at) for t in g[2:8]] == [(0, 10), (1, 10), (0, 20), (1, 20), (2, 20), (3, 20)]
    assert g[6].copied_tool_calls == 2  # both calls inherited through the parent branch
    exact_branches(g)


def test_entropy_rise_after_a_tool_result_triggers_the_branch(fake_agent, exact_branches):
    # tau = 0 and a large beta: P = 1 where entropy rose, 0 elsewhere. The step after the first
    # tool result is uncertain, so every chain branches at its second tool result (token 20),
    # with beam_size - 1 = 2 branches each: 4 chains + 8 branches, then 4 fillers.
    agent = fake_agent(unique_ids=True, entropy=lambda pos: 2.0 if 10 <= pos < 20 else 0.1)
    method = ARPO(vocab_size=100, initial_rollouts=4, beam_size=3, branch_probability=0.0, entropy_weight=100.0)
    (g,) = method.collect([[1]], agent)
    assert Counter(t.kind for t in g) == {"parent": 4, "branch": 8, "fill": 4}
    assert [(t.parent, t.at) for t in g if t.kind == "branch"] == [(k, 20) for k in range(4) for _ in range(2)]
    exact_branches(g)


def test_credit_is_grpo_on_every_token_of_each_rollout(trajectory):
    # R = 1, 0, 0, 1 -> (R - 0.5) / sqrt(1/3) = +-0.8660 on all model tokens; the branch's copied
    # prefix keeps loss and the branch's own advantage (soft attribution).
    group = [
        trajectory([2, OBS, 2], 1.0),
        trajectory([2, OBS, 2], 0.0),
        trajectory([2, OBS, 2], 0.0, kind="branch", parent=0, at=2),
        trajectory([3], 1.0, kind="fill"),
    ]
    a = np.sqrt(0.75)
    for (adv, mask), expected, t in zip(ARPO(vocab_size=100).credit([group])[0], [a, -a, -a, a], group):
        np.testing.assert_allclose(adv, np.full(t.n_model_tokens, expected), atol=1e-5)
        assert mask.all()


def test_registered_and_checked():
    assert get_method("arpo") is ARPO
    with pytest.raises(ValueError, match="initial_rollouts"):
        ARPO(vocab_size=100, initial_rollouts=17)
