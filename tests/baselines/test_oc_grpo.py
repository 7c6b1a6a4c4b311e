"""OC-GRPO [APPROX] (arXiv 2607.19313, Guide-GRPO style): hints for all-failed problems, trained
in the hint-free context with a capped importance weight; a leaked hint earns nothing."""
import numpy as np
import pytest

from baselines.oc_grpo import OCGRPO, hint, off_context_weights
from cbpo.credit import grpo_advantages
from cbpo.trajectory import Trajectory

HINTED_PROMPT = [1, 7, 7, 2, 3]  # what the test Problems' encode returns


def test_off_context_weight_is_the_capped_ratio():
    np.testing.assert_allclose(off_context_weights(np.log([0.2, 0.5, 0.9]), np.log([0.4, 0.2, 0.3]), 2.0), [0.5, 2.0, 2.0])


def test_hint_states_the_first_gold_answer():
    assert "42" in hint({"answer": ["42", "forty-two"]}) and "40" in hint({"answer": "40"})


def test_failed_problems_get_privileged_rollouts_trained_without_the_hint(fake_agent, problems, reward_rest, policy, tokenizer, logprobs_by_hand):
    agent = fake_agent(length=6, tools_at=(3,))
    seen = []

    def sample(trajs):
        seen.append([list(t.prompt_ids) for t in trajs])
        return agent(trajs)

    method = OCGRPO(budget=4)
    method.setup(policy, tokenizer, 0.8)
    # Prompt 0 fails its first two rollouts, prompt 1 solves one.
    groups = method.collect([[1, 2], [3]], sample, problems(2, lambda i, k: float(i == 1 and k == 0), by_index=True))
    assert agent.calls == [["parent"] * 4, ["privileged"] * 2 + ["parent"] * 2]
    assert seen[1] == [HINTED_PROMPT] * 2 + [[3]] * 2
    assert [t.kind for t in groups[0]] == ["parent", "parent", "privileged", "privileged"]
    assert all(t.prompt_ids == [1, 2] for t in groups[0]) and all(t.prompt_ids == [3] for t in groups[1])
    t = groups[0][2]
    model = t.model_positions()
    old = logprobs_by_hand(policy, [1, 2], t.response_ids, 0.8)[model]
    behaviour = logprobs_by_hand(policy, HINTED_PROMPT, t.response_ids, 0.8)[model]
    np.testing.assert_allclose(method.last_weights[0][2], np.minimum(np.exp(old - behaviour), 2.0), atol=1e-5)
    assert method.last_weights[1] == {}
    reward_rest(groups, lambda k: 1.0)  # both privileged rollouts solve it
    credits = method.credit(groups)
    adv = grpo_advantages(np.array([0.0, 0.0, 1.0, 1.0]))
    np.testing.assert_allclose(credits[0][2][0], adv[2] * method.last_weights[0][2], atol=1e-9)
    np.testing.assert_allclose(credits[0][0][0], np.full(6, adv[0]))


def test_a_privileged_rollout_that_copies_the_hint_gets_reward_zero(problems, reward_rest, policy, tokenizer):
    rows = problems(1).rows
    leak = tokenizer(hint(rows[0]), add_special_tokens=False)["input_ids"]

    def sample(trajs):
        out = []
        for j, t in enumerate(trajs):
            ids = leak if t.kind == "privileged" and j == 0 else [5, 6, 7]
            out.append(Trajectory(list(t.prompt_ids), list(ids), [True] * len(ids), [0.0] * len(ids), [0.1] * len(ids), finish="answer", kind=t.kind))
        return out

    method = OCGRPO(budget=4)
    method.setup(policy, tokenizer, 1.0)
    groups = method.collect([[1, 2]], sample, problems(1, lambda k: 0.0))
    assert method.last_leaks == [{2}]
    reward_rest(groups, lambda k: 1.0)
    adv = [a[0] for a, _ in method.credit(groups)[0]]
    expected = grpo_advantages(np.array([0.0, 0.0, 0.0, 1.0]))
    np.testing.assert_allclose(adv[:2], expected[:2])
    assert adv[2] < 0 < adv[3]  # the leaked rollout is scored as a failure


def test_budget_is_split_in_two_halves():
    with pytest.raises(ValueError, match="two halves"):
        OCGRPO(budget=1)


def leaky_sampler(tokenizer, rows):
    """Scripted rollouts with observation tokens; the first privileged rollout of a batch copies
    its problem's hint."""
    leak = tokenizer(hint(rows[0]), add_special_tokens=False)["input_ids"]

    def sample(trajs):
        out = []
        for j, t in enumerate(trajs):
            ids = leak if t.kind == "privileged" and j == 0 else [5, 6, 9, 9, 7, 8]
            mask = [True] * len(ids) if ids is leak else [True, True, False, False, True, True]
            out.append(Trajectory(list(t.prompt_ids), list(ids), mask, [0.0] * len(ids), [0.1] * len(ids), finish="answer", kind=t.kind))
        return out

    return sample


def test_local_credit_is_the_capped_weight_times_grpo_on_every_rollout(problems, reward_rest, policy, tokenizer, logprobs_by_hand):
    # Problem 0 fails its plain half (hinted, one privileged rollout leaks), problem 1 does not.
    batch = problems(2, lambda i, k: float(i == 1 and k == 1), by_index=True)
    method = OCGRPO(budget=4, is_cap=1.5)
    method.setup(policy, tokenizer, 0.7)
    groups = method.collect([[1, 2], [3]], leaky_sampler(tokenizer, batch.rows), batch)
    reward_rest(groups, lambda k: 1.0)
    credits = method.credit(groups)
    for x, prompt in enumerate(([1, 2], [3])):
        rewards = np.array([0.0 if (x, k) == (0, 2) else t.reward for k, t in enumerate(groups[x])])
        adv = grpo_advantages(rewards)
        for k, t in enumerate(groups[x]):
            weight = np.ones(t.n_model_tokens)
            if t.kind == "privileged":
                model = t.model_positions()
                old = logprobs_by_hand(policy, prompt, t.response_ids, 0.7)[model]
                behaviour = logprobs_by_hand(policy, HINTED_PROMPT, t.response_ids, 0.7)[model]
                weight = np.minimum(np.exp(old - behaviour), 1.5)
            np.testing.assert_allclose(credits[x][k][0], adv[k] * weight, atol=1e-5)
            assert credits[x][k][1].tolist() == [1] * t.n_model_tokens
    assert [t.kind for t in groups[0]][2:] == ["privileged"] * 2 and {t.kind for t in groups[1]} == {"parent"}


def test_without_a_model_collect_records_the_privileged_rollouts_and_off_context_weights_them(problems, reward_rest, tokenizer):
    # The verl path: no model in collect; the backend hands over both log-probs per rollout.
    batch = problems(2, lambda i, k: float(i == 1 and k == 1), by_index=True)
    method = OCGRPO(budget=4, is_cap=2.0)
    method.setup(None, tokenizer, 1.0)
    groups = method.collect([[1, 2], [3]], leaky_sampler(tokenizer, batch.rows), batch)
    assert method.last_hinted == [{2: HINTED_PROMPT, 3: HINTED_PROMPT}, {}] and method.last_leaks == [{2}, set()]
    assert all(t.prompt_ids == [1, 2] for t in groups[0])  # trained hint-free
    reward_rest(groups, lambda k: 1.0)
    with pytest.raises(KeyError):  # no weights yet: a privileged rollout is never weighted 1 by default
        method.credit(groups)
    leaked = groups[0][2].n_model_tokens
    old = {2: np.log(np.full(leaked, 0.5)), 3: np.log([0.2, 0.2, 0.9, 0.9])}
    behaviour = {2: np.log(np.full(leaked, 0.25)), 3: np.log([0.4, 0.4, 0.3, 0.3])}
    method.off_context([{k: (old[k], behaviour[k]) for k in (2, 3)}, {}], [{2}, set()])
    credits = method.credit(groups)
    adv = grpo_advantages(np.array([0.0, 0.0, 0.0, 1.0]))
    np.testing.assert_allclose(credits[0][2][0], adv[2] * np.minimum(np.exp(old[2] - behaviour[2]), 2.0))
    np.testing.assert_allclose(credits[0][3][0], adv[3] * np.array([0.5, 0.5, 2.0, 2.0]))
    np.testing.assert_allclose(credits[0][0][0], np.full(groups[0][0].n_model_tokens, adv[0]))


def test_a_privileged_rollout_that_states_the_gold_answer_before_its_answer_leaks(problems, tokenizer):
    # Issue 24.3: the hint's whole sentence almost never reappears, so a rollout that states the
    # gold answer (40) without the hint's wording kept its reward. The answer tag is where the
    # answer belongs, and a tool that prints it (an observation) is the model's own derivation.
    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    responses = {
        2: [(ids("<think>it is 40</think><answer>\\boxed{40}</answer>"), True)],  # leaks
        3: [(ids("<think>add</think><answer>\\boxed{40}</answer>"), True)],  # the final answer only
        4: [(ids("<python>print(1 + 2)</python>"), True), (ids("<result>\n40\n</result>"), False),
            (ids("<answer>\\boxed{40}</answer>"), True)],  # the tool printed it
        5: [(ids("<think>the reference answer helps</think><answer>3</answer>"), True)],  # the hint's wording
    }

    def sample(trajs):
        out = []
        for j, t in enumerate(trajs):
            parts = responses.get(j + 2 if t.kind == "privileged" else -1, [([5, 6, 7], True)])
            resp = [tok for p, _ in parts for tok in p]
            mask = [own for p, own in parts for _ in p]
            out.append(Trajectory(list(t.prompt_ids), resp, mask, [0.0] * len(resp), [0.1] * len(resp),
                                  finish="answer", kind=t.kind))
        return out

    method = OCGRPO(budget=8)
    method.setup(None, tokenizer, 1.0)
    method.collect([[1, 2]], sample, problems(1, lambda k: 0.0))
    assert method.last_leaks == [{4, 7}]  # slots 4..7 hold privileged rollouts 2..5
