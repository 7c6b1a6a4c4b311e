"""Every registered training method under the shared budget: collect returns exactly M rollouts
per kept problem through a scripted agent loop, and credit one advantage and loss-mask entry per
model token of each rollout."""
import numpy as np
import pytest

from cbpo.registry import collect, get_method, method_names, prompt_pool, reward_kl, setup

TRAINING = [name for name in method_names() if get_method(name).trains]


@pytest.mark.parametrize("name", TRAINING)
def test_collect_fills_the_budget_and_credit_covers_every_model_token(name, fake_agent, problems, reward_rest, policy, tokenizer, teacher_dir):
    extra = {"teacher": str(teacher_dir)} if name == "opd" else {}
    method = get_method(name)(vocab_size=len(tokenizer), **extra)
    setup(method, policy, tokenizer, 1.0)
    budget = method.cfg.budget
    offered = [[1, 2], [3]] * prompt_pool(method)
    groups = collect(method, offered, fake_agent(), problems(len(offered)))
    assert len(groups) == len(offered)
    kept = [g for g in groups if g]
    assert len(kept) == 2 and all(len(g) == budget for g in kept)
    reward_rest(kept)
    if reward_kl(method) > 0:  # the trainer's fill_ref_kl: REINFORCE++'s KL in the reward
        rng = np.random.default_rng(0)
        for t in (t for g in kept for t in g):
            t.ref_kl = (rng.normal(0, 0.1, len(t.response_ids)) * np.asarray(t.model_mask)).tolist()
    for g, credits in zip(kept, method.credit(kept)):
        assert len(credits) == budget
        for t, (adv, mask) in zip(g, credits):
            assert len(adv) == len(mask) == t.n_model_tokens
            assert np.all(np.isfinite(adv)) and set(np.unique(mask)) <= {0, 1}
