"""Issue 12 "Done when" (a): on the same batch, the verl path's token advantages and loss masks
(verl's DataProto, cbpo/backends/verl/credit.py as the trainer subclass calls it) equal the
local trainer's (cbpo.trainer.rollout_tensors over method.credit)."""
import numpy as np
import pytest
import torch

from cbpo.backends.verl import credit
from cbpo.registry import get_method
from cbpo.trainer import rollout_tensors

DataProto = pytest.importorskip("verl").DataProto


def verl_batch(groups, width: int, order) -> DataProto:
    """The rollouts as verl's trainer holds them after rewards: right-padded responses of
    verl's fixed width, reward on the last response token, rows in ``order``."""
    flat = [(g, k, t) for g, group in enumerate(groups) for k, t in enumerate(group)]
    flat = [flat[i] for i in order]
    mask = torch.zeros((len(flat), width), dtype=torch.int64)
    rewards = torch.zeros((len(flat), width))
    for row, (_, _, t) in enumerate(flat):
        mask[row, : len(t.model_mask)] = torch.tensor(t.model_mask, dtype=torch.int64)
        rewards[row, len(t.response_ids) - 1] = t.reward
    fields = [credit.rollout_fields(t, k) for _, k, t in flat]
    non_tensor = {"uid": np.array([f"problem-{g}" for g, _, _ in flat], dtype=object),
                  **{f: np.array([x[f] for x in fields] + [None], dtype=object)[:-1] for f in credit.FIELDS}}
    return DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": rewards}, non_tensors=non_tensor)


@pytest.mark.parametrize("method", ["cbpo", "grpo", "eapo", "branpo"])
def test_verl_path_advantages_and_loss_masks_equal_the_local_trainers(method, cbpo_groups):
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
