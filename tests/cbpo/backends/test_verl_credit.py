"""Issue 12 "Done when" (a): on the same batch, the verl path's token advantages and loss masks
(verl's DataProto, cbpo/backends/verl/credit.py as the trainer subclass calls it) equal the
local trainer's (cbpo.logprobs.rollout_tensors over method.credit). OPD's are verl's
distillation loss's, from the settings config.py generates, and equal baselines/opd.py's."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cbpo.backends.verl import credit
from cbpo.registry import get_method
from cbpo.logprobs import rollout_tensors

pytest.importorskip("verl")


@pytest.mark.parametrize("method", ["cbpo", "grpo", "eapo", "branpo"])
def test_verl_path_advantages_and_loss_masks_equal_the_local_trainers(verl_batch, method, cbpo_groups):
    groups = cbpo_groups
    flat = [t for g in groups for t in g]
    local = rollout_tensors(flat, [c for g in get_method(method)(vocab_size=64).credit(groups) for c in g], pad_id=0)

    order = np.random.default_rng(1).permutation(len(flat))  # verl's batch balancing reorders rows
    width = local["advantages"].shape[1] + 5
    batch = verl_batch(groups, width, order)
    credit.assign(batch, get_method(method)(vocab_size=64))

    inverse = np.argsort(order)
    adv, loss_mask = batch.batch["advantages"][inverse], batch.batch["response_mask"][inverse]
    r = local["advantages"].shape[1]
    assert torch.equal(adv[:, :r], local["advantages"]) and not adv[:, r:].any()
    assert torch.equal(loss_mask[:, :r].float(), local["loss_mask"]) and not loss_mask[:, r:].any()
    assert torch.equal(batch.batch["returns"], batch.batch["advantages"])
    if method == "cbpo":  # a branch's copied prefix has no loss on the verl path either
        branch = flat.index(groups[0][3])
        assert not loss_mask[branch, :4].any() and loss_mask[branch].sum() == 6


def opd_rollouts(rng, n: int) -> list:
    """Student rollouts with observation tokens (no loss) among the model tokens."""
    from cbpo.trajectory import Trajectory

    out = []
    for _ in range(n):
        length = int(rng.integers(4, 12))
        mask = [bool(m) for m in rng.random(length) < 0.7]
        mask[0] = True
        out.append(Trajectory(prompt_ids=[7, 8], response_ids=[3] * length, model_mask=mask, reward=1.0))
    return out


def test_verls_distillation_advantage_is_opds_per_token_credit(monkeypatch):
    # verl's distillation loss (k1, policy gradient) on padded tensors, with the settings the
    # suite generates for OPD, against OPD's credit on the same log-probs
    from verl.trainer.distillation import losses
    from verl.workers.config import DistillationLossConfig

    from baselines import opd
    from cbpo.backends.verl.config import VerlConfig, distillation

    rng = np.random.default_rng(0)
    trajs = opd_rollouts(rng, 6)
    width = max(len(t.response_ids) for t in trajs) + 3
    mask = torch.zeros((len(trajs), width), dtype=torch.bool)
    student, teacher = torch.zeros((len(trajs), width), dtype=torch.float64), torch.zeros((len(trajs), width), dtype=torch.float64)
    for row, t in enumerate(trajs):
        mask[row, : len(t.model_mask)] = torch.tensor(t.model_mask)
    student[mask] = -torch.rand(int(mask.sum()), dtype=torch.float64) * 3
    teacher[mask] = -torch.rand(int(mask.sum()), dtype=torch.float64) * 3
    teacher[0, 0] = -30.0  # past verl's default clamp of 10: OPD clamps nothing

    verl_cfg = VerlConfig(nodes=1, gpus_per_node=8, tensor_parallel=1, gpu_memory_utilization=0.6,
                          micro_batch_per_gpu=4, teacher_gpus=8, teacher_tensor_parallel=4)
    method = opd.OPD(teacher="some/teacher")
    settings = distillation(method.cfg, verl_cfg)["distillation_loss"]
    seen = {}

    def policy_loss(**kwargs):
        seen.update(kwargs)
        return torch.tensor(0.0), {}

    monkeypatch.setattr(losses, "no_padding_2_padding", lambda tensor, data: tensor)  # the tensors are padded
    monkeypatch.setattr(losses, "get_policy_loss_fn", lambda name: policy_loss)
    actor = SimpleNamespace(loss_agg_mode=method.cfg.loss_agg_mode, global_batch_info={}, loss_scale_factor=None)
    data = {"response_mask": mask, "teacher_logprobs": teacher.unsqueeze(-1), "old_log_probs": student,
            "dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": len(trajs)}
    losses.distillation_loss(actor, SimpleNamespace(distillation_loss=DistillationLossConfig(**settings)),
                             {"log_probs": student}, data)

    # OPD's credit with the same log-probs from its teacher and student forward passes
    per_model = {"teacher": [teacher[r][mask[r]].numpy() for r in range(len(trajs))],
                 "student": [student[r][mask[r]].numpy() for r in range(len(trajs))]}
    monkeypatch.setattr(opd, "model_token_logprobs", lambda model, *_: per_model[model])
    method.teacher, method.student, method.pad_id, method.temperature = "teacher", "student", 0, 1.0
    (credits,) = method.credit([trajs])
    for row, (a, m) in enumerate(credits):
        assert torch.equal(seen["advantages"][row][mask[row]], torch.from_numpy(a))
        assert torch.equal(seen["response_mask"][row][mask[row]], torch.from_numpy(m).bool())
    assert not seen["response_mask"][~mask].any() and seen["loss_agg_mode"] == "token-mean"
    assert seen["advantages"][0, 0] < -20


def test_the_credit_step_on_an_opd_batch_leaves_the_advantage_to_verl(verl_batch, monkeypatch):
    # no teacher in this process: OPD's own credit (setup never ran) must not be called
    opd = get_method("opd")
    monkeypatch.setattr(opd, "credit", lambda self, groups: pytest.fail("OPD.credit needs an in-process teacher"))
    trajs = opd_rollouts(np.random.default_rng(1), 4)
    batch = verl_batch([trajs], 16, range(len(trajs)))
    model_mask = batch.batch["response_mask"].clone()
    credit.assign(batch, opd(teacher="some/teacher"))
    assert torch.equal(batch.batch["response_mask"], model_mask)  # every model token, no observation token
    assert not batch.batch["advantages"].any() and batch.batch["advantages"].shape == model_mask.shape
    assert torch.equal(batch.batch["returns"], batch.batch["advantages"])


def test_branpos_truncated_rollouts_are_masked_on_the_verl_path_too(verl_batch, cbpo_groups):
    # Issue 24.6: BranPO masks a truncated rollout; the verl batch carries how each one ended.
    groups = [[t for t in g if t.kind != "branch"] for g in cbpo_groups]
    groups[0][1].finish = "length"
    flat = [t for g in groups for t in g]
    method = get_method("branpo")(vocab_size=64, base_rollouts=3, budget=4)
    local = rollout_tensors(flat, [c for g in method.credit(groups) for c in g], pad_id=0)
    batch = verl_batch(groups, local["advantages"].shape[1], np.arange(len(flat)))
    credit.assign(batch, method)
    r = local["advantages"].shape[1]
    assert torch.equal(batch.batch["response_mask"][:, :r].float(), local["loss_mask"])
    assert not local["loss_mask"][1].any() and local["loss_mask"][0].any()


def test_reinforce_pps_credit_on_verl_reads_the_k1_kl_from_old_and_reference_log_probs(verl_batch, cbpo_groups):
    # The verl batch's old_log_probs and ref_log_prob give each rollout's ref_kl, as the local
    # trainer's fill_ref_kl: the same batch and KL give the same advantages on both paths, and the
    # reward is the outcome (token_level_scores), not verl's KL-penalised token_level_rewards.
    groups = [[t for t in g if t.kind != "branch"] for g in cbpo_groups]
    flat = [t for g in groups for t in g]
    rng = np.random.default_rng(5)
    width = max(len(t.response_ids) for t in flat) + 3
    old = torch.from_numpy(rng.normal(-2.0, 0.5, (len(flat), width))).float()
    ref = old + torch.from_numpy(rng.normal(0.0, 0.3, (len(flat), width))).float()
    for t, o, r in zip(flat, old, ref):
        t.ref_kl = ((o - r)[: len(t.response_ids)].numpy() * np.asarray(t.model_mask)).tolist()
    method = get_method("reinforce_pp")(vocab_size=64, kl_coef=0.5)
    local = rollout_tensors(flat, [c for g in method.credit(groups) for c in g], pad_id=0)

    batch = verl_batch(groups, width, range(len(flat)))
    batch.batch["old_log_probs"], batch.batch["ref_log_prob"] = old, ref
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"] - 0.5 * (old - ref) * batch.batch["response_mask"]
    credit.assign(batch, get_method("reinforce_pp")(vocab_size=64, kl_coef=0.5))
    r = local["advantages"].shape[1]
    torch.testing.assert_close(batch.batch["advantages"][:, :r], local["advantages"], atol=1e-5, rtol=1e-5)
    assert local["advantages"].std() > 0 and not batch.batch["advantages"][:, r:].any()
