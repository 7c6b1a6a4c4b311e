"""Every method's credit on verl's batch, computed by the suite's own ``method.credit``.

verl 0.9 hands a registered advantage estimator only token rewards, the response mask and the
uid, so a problem's branch structure (which rollout is a branch of which parent, at which
model token) cannot reach it. The agent loop therefore writes each rollout's place in its
group into ``extra_fields`` (``rollout_fields``), verl carries them in ``non_tensor_batch``,
and the trainer subclass calls ``assign`` after rewards, in place of verl's estimator. The
rows are regrouped by uid and ordered by their index in the group, so verl's batch
balancing (which reorders rows) changes nothing. OPD's advantage is verl's distillation loss's
(config.py), not computed here.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from cbpo.backends.verl.config import DISTILLED
from cbpo.trajectory import Trajectory

FIELDS = ("cbpo_index", "cbpo_kind", "cbpo_parent", "cbpo_at", "cbpo_entropies")


def rollout_fields(t: Trajectory, index: int) -> dict:
    """What one rollout's ``AgentLoopOutput.extra_fields`` carries for credit: its index in
    the problem's group, kind, parent and branch point, and per-token entropies (EAPO, AEPO
    weight tokens by them)."""
    return {"cbpo_index": index, "cbpo_kind": t.kind, "cbpo_parent": -1 if t.parent is None else t.parent,
            "cbpo_at": -1 if t.at is None else t.at, "cbpo_entropies": list(t.entropies)}


def groups_of(data) -> tuple[list[list[Trajectory]], list[list[int]]]:
    """The batch's rollouts as the method's groups (one per uid, in group order), and for each
    group the batch rows its rollouts came from. Rewards are the token-level rewards' sums."""
    nt = data.non_tensor_batch
    mask = data.batch["response_mask"].bool().cpu().numpy()
    rewards = data.batch["token_level_rewards"].sum(-1).tolist()
    rows_of: dict[object, list[int]] = defaultdict(list)
    for row, uid in enumerate(nt["uid"]):
        rows_of[uid].append(row)
    groups, rows = [], []
    for members in rows_of.values():
        members.sort(key=lambda r: nt["cbpo_index"][r])
        groups.append([_trajectory(mask[r], rewards[r], nt, r) for r in members])
        rows.append(members)
    return groups, rows


def _trajectory(mask: np.ndarray, reward: float, nt, row: int) -> Trajectory:
    # verl pads responses on the right; the model mask of the padding is 0 and stays out of credit
    length = int(np.flatnonzero(mask)[-1]) + 1 if mask.any() else 0
    parent, at = int(nt["cbpo_parent"][row]), int(nt["cbpo_at"][row])
    return Trajectory(
        prompt_ids=[], response_ids=[0] * length, model_mask=mask[:length].tolist(),
        entropies=list(nt["cbpo_entropies"][row])[:length], kind=str(nt["cbpo_kind"][row]),
        parent=None if parent < 0 else parent, at=None if at < 0 else at, reward=float(reward),
    )


def assign(data, method) -> None:
    """Write ``advantages`` and ``returns`` (verl's names) from ``method.credit`` and take the
    method's loss mask into ``response_mask``: a branch's copied prefix gets no loss, as in
    the local trainer."""
    mask = data.batch["response_mask"]
    if method.name in DISTILLED:
        # OPD's advantage, log pi_T - log pi_S, is verl's distillation loss's own (config.py), from
        # the teacher's log-probs in the batch; OPD.credit would need a teacher in this process.
        # With use_task_rewards=false verl's PPO loss on these zeros is computed and dropped. OPD
        # trains every model token: the loss mask stays verl's, the rollouts' model-token mask.
        data.batch["advantages"] = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        data.batch["returns"] = data.batch["advantages"].clone()
        return
    groups, rows = groups_of(data)
    advantages = torch.zeros(mask.shape, dtype=torch.float32)
    loss_mask = torch.zeros(mask.shape, dtype=torch.float32)
    for group_rows, credits in zip(rows, method.credit(groups)):
        for row, (a, m) in zip(group_rows, credits):
            pos = torch.from_numpy(np.flatnonzero(mask[row].cpu().numpy()))
            advantages[row, pos] = torch.as_tensor(a, dtype=torch.float32)
            loss_mask[row, pos] = torch.as_tensor(m, dtype=torch.float32)
    data.batch["advantages"] = advantages.to(mask.device)
    data.batch["returns"] = data.batch["advantages"].clone()
    data.batch["response_mask"] = (loss_mask.to(mask.device) * mask).to(mask.dtype)
