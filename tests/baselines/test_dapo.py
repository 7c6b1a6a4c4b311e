"""DAPO (arXiv 2503.14476): overlong shaping by hand, clip-higher + token-mean against the
paper's objective, dynamic sampling's drops, extra draws and their accounting."""
import numpy as np
import pytest
import torch

from baselines.dapo import DAPO, DAPOConfig, informative, overlong_penalty
from cbpo.objective import policy_objective


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    # L_max = 100, L_cache = 20: free up to 80, then (80 - |y|) / 20 down to -1 at 100, -1 beyond.
    np.testing.assert_allclose(overlong_penalty([50, 80, 85, 90, 100, 130], 100, 20), [0, 0, -0.25, -0.5, -1, -1])
    np.testing.assert_allclose(overlong_penalty([90], 100, 20, factor=2.0), [-1.0])


def test_clip_higher_token_mean_objective_is_the_papers_equation():
    # J = (1 / sum_i |y_i|) sum_i sum_t min(r A, clip(r, 1 - 0.2, 1 + 0.28) A) on random inputs.
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(4, 6, generator=g) * 2, -torch.rand(4, 6, generator=g) * 2
    adv = torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).double()
    ratio = torch.exp(logp - old)
    j = torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv)
    expected = -(j * mask).sum() / mask.sum()
    cfg = DAPOConfig()
    loss, _ = policy_objective(logp, old, adv, mask, objective=cfg.objective())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_informative_means_rewards_not_all_equal():
    assert informative([1, 0, 0]) and informative([0.2, 0.3])
    assert not informative([0, 0, 0]) and not informative([1, 1]) and not informative([0.5, 0.5])


def test_dynamic_sampling_draws_until_the_batch_is_full_and_counts_every_extra_rollout(fake_agent, problems):
    # 2 problems per step, pool of 3 batches. Prompts 0, 2, 3 have all-equal rewards (dropped);
    # prompt 1 is kept in batch 1, prompt 4 in batch 3; prompt 5 is never drawn.
    solvable = {1, 4, 5}
    reward = lambda i, k: float(i in solvable and k % 2 == 0)  # noqa: E731
    scored = []
    agent = fake_agent(length=6, tools_at=(3,))
    method = DAPO(budget=4, max_num_gen_batches=3)
    assert method.prompt_pool == 3
    groups = method.collect([[10 + i] for i in range(6)], agent, problems(6, reward, scored, by_index=True))
    assert scored == [[0, 1], [2, 3], [4, 5]] and len(agent.calls) == 3
    assert [len(g) for g in groups] == [0, 4, 0, 0, 4, 0]  # prompt 5 was informative but past the batch
    assert all(t.prompt_ids == [11] for t in groups[1])
    stats = method.step_stats()
    assert stats["gen_batches"] == 3 and stats["kept_groups"] == 2
    assert stats["extra_rollouts"] == 24 - 8  # 6 prompts x 4 drawn, 2 x 4 trained
    assert stats["extra_generated_tokens"] == 16 * 6 and stats["extra_tool_calls"] == 16


def test_the_cap_ends_the_step_with_the_groups_kept_so_far(fake_agent, problems):
    method = DAPO(budget=4, max_num_gen_batches=2)
    groups = method.collect([[1], [2], [3], [4]], fake_agent(), problems(4, lambda i, k: float(i == 0 and k == 0), by_index=True))
    assert [len(g) for g in groups] == [4, 0, 0, 0]
    assert method.step_stats()["extra_rollouts"] == 12


def test_without_filtering_one_batch_is_drawn_and_kept(fake_agent, problems):
    method = DAPO(budget=4, filter_groups=False)
    assert method.prompt_pool == 1
    groups = method.collect([[1], [2]], fake_agent(), problems(2, lambda k: 0.0))
    assert [len(g) for g in groups] == [4, 4] and method.step_stats()["extra_rollouts"] == 0


def test_credit_normalises_the_length_shaped_reward(trajectory):
    # L_max = 10, L_cache = 2 (0.2): lengths 6, 9, 12 (observations count) -> penalties 0, -0.5, -1.
    group = [trajectory([6], 1.0), trajectory([4, (7, 7), 3], 1.0), trajectory([12], 1.0)]
    (a0, _), (a1, _), (a2, _) = DAPO(budget=3, max_response_len=10).credit([group])[0]
    shaped = np.array([1.0, 0.5, 0.0])  # mean 0.5, sample std 0.5
    np.testing.assert_allclose([a0[0], a1[0], a2[0]], (shaped - 0.5) / (0.5 + 1e-6))
    assert len(a1) == 7


def test_budget_and_pool_checks():
    with pytest.raises(ValueError, match="budget >= 2"):
        DAPO(budget=1)
    with pytest.raises(ValueError, match="multiple of its pool"):
        DAPO(max_num_gen_batches=2).collect([[1], [2], [3]], None, None)


def test_a_problem_offered_twice_in_a_step_is_drawn_and_trained_once(fake_agent, problems):
    # Issue 24.4: 24 pool problems, 80 offered per step: the trainer's offer repeats problems,
    # and each repeat was drawn again (16 more rollouts) and could be trained twice in one step.
    offered = [[1], [2], [1], [3], [2], [3], [4], [1]]
    reward = lambda i, k: float(offered[i] not in ([1], [3]) and k == 0)  # noqa: E731: 1 and 3 uninformative
    scored = []
    method = DAPO(budget=4, max_num_gen_batches=4)
    groups = method.collect(offered, fake_agent(), problems(8, reward, scored, by_index=True))
    assert scored == [[0, 1], [3], [6]]  # batch 2 only repeats: nothing drawn
    assert [t.prompt_ids for g in groups for t in g[:1]] == [[2], [4]]
    assert method.step_stats()["gen_batches"] == 3 and method.step_stats()["extra_rollouts"] == 8
