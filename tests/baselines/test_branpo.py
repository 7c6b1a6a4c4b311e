"""BranPO: difficulty-aware contrastive tail branching, prefix and branch advantages, Redundant
Step Masking (arXiv 2602.03719, section 3, and its official code)."""
from collections import Counter

import numpy as np
import pytest

from baselines.branpo import BranPO, preference, schedule
from cbpo.registry import Problems, collect, get_method

OBS = (7, 7)


def scripted_problems(base_rewards, branch_reward):
    """Rewards base rollouts from per-problem lists (in sampling order) and every branch of
    problem x with branch_reward[x], as the trainer's in-loop scorer would."""
    seen = Counter()

    def score(groups, indices):
        for g, x in zip(groups, indices):
            for t in g:
                if t.kind == "parent":
                    t.reward = base_rewards[x][seen[x]]
                    seen[x] += 1
                else:
                    t.reward = branch_reward[x]

    return Problems(rows=[{} for _ in base_rewards], encode=lambda q: [1], score=score)


def test_schedule_follows_the_difficulty_table(trajectory):
    three, two = trajectory([2, OBS, 2, OBS, 2], 1.0), trajectory([2, OBS, 2], 1.0)
    wrong = trajectory([2, OBS, 2], 0.0)
    # (row, trailing steps per level, attempts per level)
    as_tuple = lambda s: (s.row, s.levels, s.attempts)  # noqa: E731
    assert as_tuple(schedule(three, 0.75, 2.0, 0.8)) == (0, (2,), 5)  # mid accuracy, correct, long
    assert as_tuple(schedule(two, 1.0, 2.0, 0.8)) == (1, (1,), 1)  # all correct
    assert as_tuple(schedule(wrong, 0.25, 2.0, 0.8)) == (2, (1, 2, 3), 2)  # hard and wrong
    assert as_tuple(schedule(two, 0.25, 2.0, 0.8)) == (3, (1, 2), 2)  # hard, correct
    assert as_tuple(schedule(wrong, 0.875, 2.0, 0.8)) == (3, (1, 2), 2)  # easy, wrong
    assert as_tuple(schedule(two, 0.875, 2.0, 0.8)) == (4, (), 0)  # easy, correct, not long
    truncated = trajectory([2, OBS, 2], 0.0, finish="length")
    assert schedule(truncated, 0.25, 2.0, 0.8).levels == ()


def test_preference_is_a_reward_flip_or_a_step_count_at_mid_accuracy(trajectory):
    right, wrong = trajectory([2, OBS, 2], 1.0), trajectory([2, OBS, 2], 0.0)
    shorter, longer = trajectory([4], 1.0), trajectory([2, OBS, 2, OBS, 2], 1.0)
    assert preference(wrong, right, 0.25, 0.8) == 1 and preference(right, wrong, 0.25, 0.8) == -1
    assert preference(right, shorter, 0.75, 0.8) == 1 and preference(right, longer, 0.75, 0.8) == -1
    assert preference(right, shorter, 1.0, 0.8) == 0  # step contrast only when 0.5 < acc < 1
    assert preference(wrong, trajectory([2], 1.0, finish="turns"), 0.25, 0.8) == 0  # masked out


def test_credit_matches_hand_worked_prefix_and_branch_advantages(trajectory):
    # Four base rollouts of 3 steps (6 model tokens, steps at 0, 2, 4), R = 1, 0, 0, 0 (acc 0.25).
    # Rollout 4 re-samples base 1's last step (cut at 4) and is right: a contrast, kept (+1; base
    # 1's own tail -1). Rollout 5 re-samples base 0's last step, also right: no contrast, dropped;
    # base 0 is still cut at 4. Bases 2 and 3 had no attempt: cut 2 steps before the end, at 2.
    group = [trajectory([2, OBS, 2, OBS, 2], r, kind="parent") for r in (1.0, 0.0, 0.0, 0.0)]
    group += [
        trajectory([2, OBS, 2, OBS, 2], 1.0, kind="branch", parent=1, at=4),
        trajectory([2, OBS, 2, OBS, 2], 1.0, kind="branch", parent=0, at=4),
    ]
    # Prefix rewards (mean over each base's tails): 1, 0.5, 0, 0 -> mean 0.375, sample std
    # sqrt(0.6875 / 3) = 0.478714 -> A_pre = 1.305582, 0.261116, -0.783349, -0.783349.
    # Tails: bases 0-3 and rollout 4, R = 1, 0, 0, 0, 1 -> mean 0.4, std sqrt(0.3) -> A_br =
    # 1.095445, -0.730297 (x3), 1.095445. Base 1's tail is rejected but negative: no masking.
    pre = np.array([1.305582, 0.261116, -0.783349, -0.783349])
    br = np.array([1.095445, -0.730297, -0.730297, -0.730297, 1.095445])
    credit = BranPO(vocab_size=100, base_rollouts=4, budget=6).credit([group])[0]
    expected = [
        [pre[0]] * 4 + [br[0]] * 2,
        [pre[1]] * 4 + [br[1]] * 2,
        [pre[2]] * 2 + [br[2]] * 4,
        [pre[3]] * 2 + [br[3]] * 4,
        [0.0] * 4 + [br[4]] * 2,
        [0.0] * 6,
    ]
    masks = [[1] * 6] * 4 + [[0] * 4 + [1] * 2, [0] * 6]  # copied prefix and the dropped attempt: no loss
    for (adv, mask), e, m in zip(credit, expected, masks):
        np.testing.assert_allclose(adv, e, atol=1e-5)
        assert mask.tolist() == m


def test_redundant_step_masking_zeroes_the_first_step_of_a_longer_correct_tail(trajectory):
    # R = 1, 1, 1, 0 (acc 0.75). Base 0 takes 3 steps, one more than the mean correct rollout;
    # its re-sampled last two steps (cut at 2) reach the answer in one: the branch is preferred,
    # base 0's tail rejected. Tails R = 1, 1, 1, 0, 1: mean 0.8, std sqrt(0.2) -> A_br = 0.447214
    # (correct), -1.788854; base 0's tail is positive and rejected: its first step [2, 4) gets 0.
    # Prefixes R = 1, 1, 1, 0 -> A_pre = 0.5 (x3), -1.5. Bases 1-3 (2 steps) are all tail.
    group = [trajectory([2, OBS, 2, OBS, 2], 1.0, kind="parent")]
    group += [trajectory([2, OBS, 2], r, kind="parent") for r in (1.0, 1.0, 0.0)]
    group.append(trajectory([2, OBS, 2], 1.0, kind="branch", parent=0, at=2))
    a, b = 0.447214, -1.788854
    credit = BranPO(vocab_size=100, base_rollouts=4, budget=5).credit([group])[0]
    np.testing.assert_allclose(credit[0][0], [0.5, 0.5, 0.0, 0.0, a, a], atol=1e-5)
    np.testing.assert_allclose(credit[3][0], [b] * 4, atol=1e-5)
    np.testing.assert_allclose(credit[4][0], [0.0, 0.0, a, a], atol=1e-5)
    unmasked = BranPO(vocab_size=100, base_rollouts=4, budget=5, redundant_step_masking=False).credit([group])[0]
    np.testing.assert_allclose(unmasked[0][0], [0.5, 0.5, a, a, a, a], atol=1e-5)


def test_collect_searches_for_contrast_within_the_budget(fake_agent, exact_branches):
    agent = fake_agent(unique_ids=True)  # 3 steps: tool observations before model tokens 10 and 20
    method = get_method("branpo")(vocab_size=100)
    base = [[1.0] + [0.0] * 7, [1.0] * 8, [1.0] * 7 + [0.0]]
    groups = collect(method, [[1], [2], [3]], agent, scripted_problems(base, [0.0, 1.0, 0.0]))
    # Problem 0 (acc 1/8): every base rollout gets an attempt at its last step; 8 fill the budget.
    # Problem 1 (acc 1): one attempt each at the last step, none contrasts. Problem 2 (acc 7/8):
    # only the wrong rollout searches, 2 attempts at its last step, then 2 at its last two;
    # its wrong branches never contrast, so 4 slots are left for fresh rollouts.
    assert [Counter(c) for c in agent.calls] == [
        Counter(parent=24), Counter(branch=17), Counter(branch=1), Counter(branch=1), Counter(branch=1), Counter(fill=4),
    ]
    assert [Counter(t.kind for t in g) for g in groups] == [
        {"parent": 8, "branch": 8}, {"parent": 8, "branch": 8}, {"parent": 8, "branch": 4, "fill": 4},
    ]
    assert [(t.parent, t.at) for t in groups[2] if t.kind == "branch"] == [(7, 20), (7, 20), (7, 10), (7, 10)]
    for g in groups:
        exact_branches(g)
    for t in groups[2][12:]:
        t.reward = 0.0  # the trainer rewards the fillers after collect
    # Only base 0's attempt in problem 0 contrasts (a wrong tail for a right rollout): kept.
    credit = method.credit(groups)
    trained = [t.parent for t, (_, m) in zip(groups[0], credit[0]) if t.kind == "branch" and m.any()]
    assert trained == [0]
    assert all(len(a) == len(m) == t.n_model_tokens for g, c in zip(groups, credit) for t, (a, m) in zip(g, c))


def test_short_slots_go_to_the_table_rows_first(fake_agent):
    agent = fake_agent(unique_ids=True)
    method = BranPO(vocab_size=100, budget=12, base_rollouts=8)  # 8 base + 4 attempts
    (g,) = collect(method, [[1]], agent, scripted_problems([[1.0] + [0.0] * 7], [0.0]))
    # Wrong rollouts of a hard problem (row 2) come before the right one (row 3).
    assert [t.parent for t in g if t.kind == "branch"] == [1, 2, 3, 4]


def test_collect_needs_the_in_loop_scorer(fake_agent):
    with pytest.raises(TypeError):
        BranPO(vocab_size=100).collect([[1]], fake_agent(unique_ids=True))


def test_the_scripts_rejection_truncation_masking_and_clip_high(trajectory):
    # Issue 24.6: the paper's search script rejects all-0 / all-1 groups (rllm.rejection_sample),
    # masks truncated samples (mask_truncated_samples) and clips at 0.2 / 0.28.
    solved = [trajectory([2, OBS, 2], 1.0, kind="parent") for _ in range(4)]
    failed = [trajectory([2, OBS, 2], 0.0, kind="parent") for _ in range(4)]
    method = BranPO(vocab_size=100, base_rollouts=4, budget=4)
    for group in (solved, failed):
        assert not any(m.any() for _, m in method.credit([group])[0])
    mixed = [trajectory([2, OBS, 2], r, kind="parent") for r in (1.0, 0.0, 0.0)]
    mixed.append(trajectory([2, OBS, 2], 1.0, kind="parent", finish="length"))
    credit = method.credit([mixed])[0]
    assert [bool(m.any()) for _, m in credit] == [True, True, True, False]
    assert BranPO(vocab_size=100, base_rollouts=4, budget=4, mask_truncated=False).credit([mixed])[0][3][1].all()
    assert BranPO(vocab_size=100, base_rollouts=4, budget=4, reject_uniform_groups=False).credit([solved])[0][0][1].all()
    objective = method.cfg.objective()
    assert (objective.clip_eps, objective.clip_high, objective.loss_agg_mode) == (0.2, 0.28, "token-mean")
