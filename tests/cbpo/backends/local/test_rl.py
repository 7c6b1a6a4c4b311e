"""The local backend's RL loop (cbpo/backends/local/rl.py): one policy update, its mini- and
micro-batches, the problem stream, what the loop takes from the method, rollout dumps."""
import copy
import json

import numpy as np
import pytest
import torch

import cbpo.backends.local.rl as rl
from cbpo.backends.local.rl import policy_update
from cbpo.logprobs import rollout_tensors, token_logprobs, update_tensors
from cbpo.objective import LOSS_AGG_MODES, ObjectiveConfig
from cbpo.runlog import MetricsLog
from cbpo.stages import RLConfig
from cbpo.trajectory import Trajectory


def _traj(prompt, resp, model_mask):
    return Trajectory(prompt, resp, model_mask, [-1.0] * len(resp), [0.5] * len(resp))


def test_policy_update_moves_probability_toward_positive_advantage(model, tokenizer):
    t = _traj([5, 6], [8, 9, 10], [True, True, True])
    with torch.no_grad():
        batch = rollout_tensors([t], [(np.zeros(3), np.ones(3))], 0)
        before = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = RLConfig(micro_batch_size=1)
    stats = policy_update(model, None, opt, [t], [(np.ones(3), np.ones(3))], cfg, ObjectiveConfig(beta=0.0), 0)
    with torch.no_grad():
        after = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 3)
    assert stats["grad_norm"] > 0 and (after > before).all()
    # A fully masked rollout set is skipped, not divided by zero.
    assert policy_update(model, None, opt, [t], [(np.ones(3), np.zeros(3))], cfg, ObjectiveConfig(beta=0.0), 0)["skipped"] == 1.0


def test_mini_batches_step_against_the_sampling_policy_so_clipping_binds(tokenizer, tiny_causal_lm):
    # Two mini-batches: two optimiser steps, the second against pi_old of before the first, so
    # its ratio moves off 1 and the (tight) clip range clips tokens; one mini-batch never does.
    trajs = [_traj([5, 6], [8 + k, 9, 10], [True, True, True]) for k in range(4)]
    credits = [(np.full(3, 1.0 if k % 2 else -1.0), np.ones(3)) for k in range(4)]
    objective = ObjectiveConfig(beta=0.0, clip_eps=0.01)
    stats = {}
    for n in (1, 2):
        model = tiny_causal_lm(tokenizer)
        opt = torch.optim.SGD(model.parameters(), lr=2.0)
        steps = []
        opt.step = (lambda step: lambda *a, **k: steps.append(1) or step(*a, **k))(opt.step)
        stats[n] = policy_update(model, None, opt, trajs, credits, RLConfig(ppo_mini_batches=n, micro_batch_size=1), objective, 0)
        assert len(steps) == n
    assert stats[1]["ppo_kl"] == 0.0 and stats[1]["pg_clipfrac"] == 0.0
    assert stats[2]["ppo_kl"] != 0.0 and stats[2]["pg_clipfrac"] > 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_give_the_full_batch_gradient(model, mode):
    # Rollouts of different lengths and loss-token counts (an observation, a masked token): one
    # rollout per micro-batch must give the whole batch's gradient, KL term included, for every
    # aggregation (token-mean weights micro-batches by loss tokens, not by sequences).
    trajs = [_traj([5, 6], [8, 9, 10, 11, 12], [True] * 5), _traj([5], [8, 9], [True, True]),
             _traj([7, 5, 6], [8, 9, 10], [True, False, True])]
    credits = [(np.array([1.0, -0.5, 0.3, 0.8, -1.2]), np.array([1, 1, 0, 1, 1])),
               (np.array([0.7, -0.2]), np.ones(2)), (np.array([-1.0, 0.4]), np.ones(2))]
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    objective = ObjectiveConfig(loss_agg_mode=mode, beta=0.1)
    runs = []
    for micro_batch_size in (3, 1):
        net = copy.deepcopy(model)
        stats = policy_update(net, ref_model, torch.optim.SGD(net.parameters(), lr=0.0), trajs, credits,
                              RLConfig(micro_batch_size=micro_batch_size, max_grad_norm=1e9), objective, 0)
        runs.append((torch.cat([p.grad.flatten() for p in net.parameters()]), stats))
    (whole, whole_stats), (split, split_stats) = runs
    assert whole.abs().max() > 0
    # float32 rounding, relative to the gradient's scale (token-sum's reaches 3 here): the micro-
    # batches' rows and the whole batch's are summed in different orders and layouts (rl.shared_prefix)
    assert torch.allclose(whole, split, rtol=1e-4, atol=1e-5 * whole.abs().max().item())
    assert split_stats["loss"] == pytest.approx(whole_stats["loss"], rel=1e-5)


def test_shared_prefix_update_takes_the_same_steps(model, monkeypatch):
    # rl.shared_prefix (#37 item 3): two mini-batches, a KL term and micro-batches of two rows,
    # rows sharing a prompt and a branch's prefix: the same parameters after the update.
    trajs = [_traj([5, 6], [8, 9, 10, 11], [True, True, False, True]), _traj([5, 6], [8, 12], [True, True]),
             _traj([5, 6], [8, 9, 10, 13], [True, True, False, True]), _traj([7], [8, 9], [True, True]),
             _traj([5, 6], [14], [True]), _traj([7], [15, 9, 10], [True, True, True])]
    rng = np.random.default_rng(1)
    credits = [(rng.normal(size=t.n_model_tokens), np.ones(t.n_model_tokens)) for t in trajs]
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    layouts = []
    monkeypatch.setattr(rl, "update_tensors", lambda *a, **k: layouts.append(update_tensors(*a, **k)) or layouts[-1])
    nets, stats = [], []
    for shared in (False, True):
        net = copy.deepcopy(model)
        cfg = RLConfig(micro_batch_size=2, ppo_mini_batches=2, shared_prefix=shared)
        stats.append(policy_update(net, ref_model, torch.optim.AdamW(net.parameters(), lr=1e-2), trajs, credits, cfg,
                                   ObjectiveConfig(beta=0.1), 0))
        nets.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (nets[0] - start).abs().max() > 1e-3
    assert any("visible" in b for b in layouts)  # trees ran (the shared run's micro-batches)
    assert torch.allclose(nets[1], nets[0], atol=1e-5, rtol=0)
    assert stats[1]["loss"] == pytest.approx(stats[0]["loss"], abs=1e-6)
    assert stats[1]["ppo_kl"] == pytest.approx(stats[0]["ppo_kl"], abs=1e-6) and stats[0]["ppo_kl"] != 0.0


def test_step_problems_walk_epochs_over_the_pool():
    from cbpo.backends.local.rl import step_problems

    domains = ["math"] * 40 + ["search"] * 60
    steps = [step_problems(domains, s, 8, 24, seed=1) for s in range(9)]  # 3 steps per epoch
    epochs = [sorted(sum(steps[e * 3 : e * 3 + 3], [])) for e in range(3)]
    assert epochs[0] == epochs[1] == epochs[2] and len(set(epochs[0])) == 24  # the same 24 problems
    assert sum(domains[i] == "math" for i in epochs[0]) == 12
    assert all(sum(domains[i] == "math" for i in s) == 4 for s in steps)  # balanced steps
    assert steps[:3] != steps[3:6]  # reshuffled each epoch
    assert step_problems(domains, 7, 8, 24, seed=1) == steps[7]  # resumable: a function of the step
    whole = [i for s in range(25) for i in step_problems(domains, s, 4, None, seed=0)]
    assert sorted(whole) == list(range(100))  # no pool: one epoch visits every row once
    assert len(step_problems(domains, 2, 8, 20, seed=0)) == 8  # a step may straddle two epochs


def test_stratified_pick_balances_domains_and_is_deterministic():
    from cbpo.backends.local.rl import stratified_pick

    domains = ["math"] * 90 + ["search"] * 10
    pick = stratified_pick(domains, 8, np.random.default_rng(3))
    assert len(set(pick)) == 8
    assert sum(domains[i] == "search" for i in pick) == 4
    assert pick == stratified_pick(domains, 8, np.random.default_rng(3))
    assert len(stratified_pick(["a"] * 3, 8, np.random.default_rng(0))) == 3


def test_rl_rejects_a_pool_smaller_than_a_step(tmp_path):
    from cbpo.backends.local.rl import rl_train

    rows = [{"question": "q", "domain": "math"}] * 10
    for pool in (4, 11):
        with pytest.raises(ValueError, match="pool_size"):
            rl_train(None, None, None, rows, {}, None, RLConfig(problems_per_step=8, pool_size=pool), tmp_path, MetricsLog(tmp_path / "m.jsonl"))


def test_the_local_trainer_refuses_verls_one_step_off_policy(tmp_path):
    from cbpo.backends.local.rl import rl_train

    rows = [{"question": "q", "domain": "math"}] * 10
    with pytest.raises(ValueError, match="rl.async_training=one_step_off is verl's trainer"):
        rl_train(None, None, None, rows, {}, None, RLConfig(async_training="one_step_off"), tmp_path,
                 MetricsLog(tmp_path / "m.jsonl"))


def test_rl_train_takes_the_objective_and_entropy_k_from_the_method(model, tokenizer, tmp_path, monkeypatch):
    # method.beta, method.clip_eps and CBPO's method.top_k are the values the loop uses: the
    # reference model exists because beta > 0, and the engine's entropies keep top_k tokens.
    from cbpo.registry import get_method
    from cbpo.rollout.agent import AgentConfig

    seen = {}

    class RecordingEngine(rl.HFEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["top_k"] = self.top_k_entropy

    def update(model, ref_model, opt, trajs, credits, cfg, objective, pad_id, dtype):
        seen.update(objective=objective, ref=ref_model)
        return {"loss": 0.0}

    monkeypatch.setattr(rl, "HFEngine", RecordingEngine)
    monkeypatch.setattr(rl, "policy_update", update)
    method = get_method("cbpo")(vocab_size=len(tokenizer), budget=2, n0=1, w=2, d_min=2, top_k=3, beta=0.5, clip_eps=0.3)
    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=1, problems_per_step=1, agent=AgentConfig(max_new_tokens=4, max_total_tokens=8))
    rl.rl_train(model, tokenizer, method, rows, {}, lambda texts, rows: [0.0] * len(texts), cfg, tmp_path,
                     MetricsLog(tmp_path / "m.jsonl"), None)
    assert seen["top_k"] == 3
    assert seen["objective"] == ObjectiveConfig(beta=0.5, clip_eps=0.3)
    assert seen["ref"] is not None


def test_reinforce_pp_gets_each_rollouts_k1_kl_against_the_reference_before_credit(model, tokenizer, tmp_path, monkeypatch):
    # Plain REINFORCE++ puts beta KL_t in its token reward: the loop keeps a reference model
    # though the method has no KL loss, and before credit each rollout's ref_kl is
    # log pi_old - log pi_ref of its sampled tokens (0 on observations). The reference here is
    # a perturbed copy, so the KL is not zero; it is recomputed by hand from both models.
    from cbpo.registry import get_method
    from cbpo.rollout.agent import AgentConfig

    seen = {}
    real_fill = rl.fill_ref_kl

    def fill(model, ref_model, trajs, cfg, pad_id, dtype):
        with torch.no_grad():
            for p in ref_model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        real_fill(model, ref_model, trajs, cfg, pad_id, dtype)
        seen.update(ref=ref_model, trajs=list(trajs))

    def update(model, ref_model, opt, trajs, credits, cfg, objective, pad_id, dtype):
        seen.update(objective=objective, credits=credits)
        return {"loss": 0.0}

    monkeypatch.setattr(rl, "fill_ref_kl", fill)
    monkeypatch.setattr(rl, "policy_update", update)
    method = get_method("reinforce_pp")(vocab_size=len(tokenizer), budget=3)
    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=1, problems_per_step=1, temperature=1.0, agent=AgentConfig(max_new_tokens=6, max_total_tokens=12))
    rl.rl_train(model, tokenizer, method, rows, {}, lambda texts, rows: [1.0, 0.0, 0.0][: len(texts)], cfg, tmp_path,
                     MetricsLog(tmp_path / "m.jsonl"), None)
    assert seen["objective"].beta == 0.0 and seen["ref"] is not None
    t = seen["trajs"][0]
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        by_hand = (token_logprobs(model, ids, mask, len(t.response_ids))
                   - token_logprobs(seen["ref"], ids, mask, len(t.response_ids)))[0].numpy()
    np.testing.assert_allclose(t.ref_kl, by_hand * np.asarray(t.model_mask), atol=1e-5)
    assert np.abs(t.ref_kl).max() > 1e-3 and all(len(c[0]) == u.n_model_tokens for c, u in zip(seen["credits"], seen["trajs"]))


def test_rollouts_are_dumped_every_kth_step_and_at_the_last(model, tokenizer, tmp_path):
    # Paper-scale dumps are large: dump_every keeps a few steps (and always the last, which
    # the figures read) instead of every one.
    from cbpo.registry import get_method
    from cbpo.rollout.agent import AgentConfig
    from cbpo.backends.local.rl import rl_train

    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=5, problems_per_step=1, dump_rollouts=True, dump_every=2,
                   agent=AgentConfig(max_new_tokens=4, max_total_tokens=8))
    method = get_method("grpo")(vocab_size=len(tokenizer), budget=2)
    rl_train(model, tokenizer, method, rows, {}, lambda texts, rows: [0.0] * len(texts), cfg, tmp_path,
             MetricsLog(tmp_path / "m.jsonl"), None)
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_000002.jsonl", "step_000004.jsonl", "step_000005.jsonl"]
    with pytest.raises(ValueError, match="dump_every"):
        RLConfig(dump_every=0)


def test_dumped_rollouts_keep_the_engines_logprobs_aligned_with_the_tokens(model, tokenizer, tmp_path, monkeypatch):
    # The credit lab reads the decision-token probability from these log-probs.
    from cbpo.registry import get_method
    from cbpo.rollout.agent import AgentConfig

    sampled = []

    def update(model, ref_model, opt, trajs, credits, cfg, objective, pad_id, dtype):
        sampled.extend(trajs)
        return {"loss": 0.0}

    monkeypatch.setattr(rl, "policy_update", update)
    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=1, problems_per_step=1, dump_rollouts=True, agent=AgentConfig(max_new_tokens=6, max_total_tokens=8))
    method = get_method("grpo")(vocab_size=len(tokenizer), budget=2)
    rl.rl_train(model, tokenizer, method, rows, {}, lambda texts, rows: [0.0] * len(texts), cfg, tmp_path,
                     MetricsLog(tmp_path / "m.jsonl"), None)
    dumped = [json.loads(line) for line in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(dumped) == len(sampled) == 2
    for row, t in zip(dumped, sampled):
        assert row["response_ids"] == t.response_ids
        assert len(row["logprob"]) == len(row["response_ids"]) == len(row["entropy"])
        model_lp = [lp for lp, m in zip(row["logprob"], row["model_mask"]) if m]
        assert model_lp == pytest.approx(np.asarray(t.logprobs)[t.model_positions()], abs=1e-5)
        assert all(lp < 0 for lp in model_lp)
