"""Every method's credit on verl's batch, computed by the suite's own ``method.credit``.

verl 0.9 hands a registered advantage estimator only token rewards, the response mask and the
uid, so a problem's branch structure (which rollout is a branch of which parent, at which
model token) cannot reach it. The agent loop therefore writes each rollout's place in its
group into ``extra_fields`` (``rollout_fields``), verl carries them in ``non_tensor_batch``,
and the trainer subclass calls ``assign`` after rewards, in place of verl's estimator. The
rows are regrouped by uid and ordered by their index in the group, so verl's batch
balancing (which reorders rows) changes nothing. OPD's advantage is verl's distillation loss's
(config.py), not computed here. OC-GRPO's importance weights need the actor's log-probs of
its privileged rollouts in their hinted context: the trainer computes them and ``off_context``
hands them, with verl's ``old_log_probs``, to the method before ``assign``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from cbpo import registry
from cbpo.trajectory import Trajectory

FIELDS = ("cbpo_index", "cbpo_kind", "cbpo_parent", "cbpo_at", "cbpo_entropies", "cbpo_finish", "cbpo_hinted_prompt",
          "cbpo_leaked")

def rollout_fields(t: Trajectory, index: int, hinted_prompt: Sequence[int] = (), leaked: bool = False) -> dict:
    """What one rollout's ``AgentLoopOutput.extra_fields`` carries for credit: its index in
    the problem's group, kind, parent and branch point, per-token entropies (EAPO, AEPO
    weight tokens by them), how it ended (BranPO masks truncated rollouts) and, for OC-GRPO's privileged rollouts, the hinted prompt (x, p)
    it was sampled from and whether it leaked the hint."""
    return {"cbpo_index": index, "cbpo_kind": t.kind, "cbpo_parent": -1 if t.parent is None else t.parent,
            "cbpo_at": -1 if t.at is None else t.at, "cbpo_entropies": list(t.entropies), "cbpo_finish": t.finish,
            "cbpo_hinted_prompt": list(hinted_prompt), "cbpo_leaked": bool(leaked)}


def groups_of(data, ref_kl: bool = False) -> tuple[list[list[Trajectory]], list[list[int]]]:
    """The batch's rollouts as the method's groups (one per uid, in group order), and for each
    group the batch rows its rollouts came from. Each rollout is rebuilt from the batch's own
    response tokens, observations included, up to its length (the response part of verl's
    ``attention_mask``; verl pads on the right): the credit sees the tokens and lengths the local
    trainer's does (GiGPO's anchor observations, DAPO's |y|). Rewards are the outcome rewards, the
    token-level scores' sums (before a KL penalty verl may put in ``token_level_rewards``).
    With ``ref_kl`` each rollout's ``ref_kl`` is log pi_old - log pi_ref (k1) from the batch's
    ``old_log_probs`` and ``ref_log_prob``, on its model tokens, as the local trainer's."""
    nt = data.non_tensor_batch
    mask = data.batch["response_mask"].bool().cpu().numpy()
    responses = data.batch["responses"].cpu().numpy()
    lengths = data.batch["attention_mask"][:, -responses.shape[1]:].sum(-1).tolist()
    rewards = data.batch["token_level_scores"].sum(-1).tolist()
    kl = (data.batch["old_log_probs"] - data.batch["ref_log_prob"]).float().cpu().numpy() * mask if ref_kl else None
    rows = group_rows(nt)
    return [[_trajectory(responses[r][: lengths[r]], mask[r], rewards[r], nt, r, None if kl is None else kl[r])
             for r in members] for members in rows], rows


def group_rows(nt) -> list[list[int]]:
    """The batch rows of each group (one per uid, in order of first appearance), in group order."""
    rows_of: dict[object, list[int]] = defaultdict(list)
    for row, uid in enumerate(nt["uid"]):
        rows_of[uid].append(row)
    return [sorted(members, key=lambda r: nt["cbpo_index"][r]) for members in rows_of.values()]


def privileged_rows(data) -> list[int]:
    """The batch rows of privileged rollouts (OC-GRPO's hinted ones), in batch order."""
    return [row for row, kind in enumerate(data.non_tensor_batch["cbpo_kind"]) if kind == "privileged"]


def off_context(data, method, behaviour: torch.Tensor) -> None:
    """OC-GRPO's privileged rollouts on verl's batch, handed to ``method.off_context`` for its
    credit: old log-probs are verl's ``old_log_probs`` (the actor before the update, hint-free
    context), behaviour log-probs ``behaviour`` (one row per ``privileged_rows``, the same
    actor on the hinted prompt), both on the rollout's model tokens; leaks as the agent loop
    flagged them."""
    nt = data.non_tensor_batch
    mask = data.batch["response_mask"].bool().cpu()
    old = data.batch["old_log_probs"].double().cpu()
    by_row = dict(zip(privileged_rows(data), behaviour.double().cpu()))
    rows = group_rows(nt)
    logprobs = [{k: (old[r][mask[r]].numpy(), by_row[r][mask[r]].numpy()) for k, r in enumerate(members) if r in by_row}
                for members in rows]
    method.off_context(logprobs, [{k for k, r in enumerate(members) if nt["cbpo_leaked"][r]} for members in rows])


def _trajectory(ids: np.ndarray, mask: np.ndarray, reward: float, nt, row: int, kl: np.ndarray | None = None) -> Trajectory:
    length = len(ids)
    parent, at = int(nt["cbpo_parent"][row]), int(nt["cbpo_at"][row])
    return Trajectory(
        prompt_ids=[], response_ids=ids.tolist(), model_mask=mask[:length].tolist(),
        entropies=list(nt["cbpo_entropies"][row])[:length], ref_kl=[] if kl is None else kl[:length].tolist(),
        kind=str(nt["cbpo_kind"][row]),
        parent=None if parent < 0 else parent, at=None if at < 0 else at, reward=float(reward),
        finish=str(nt["cbpo_finish"][row]),
    )


def assign(data, method) -> None:
    """Write ``advantages`` and ``returns`` (verl's names) from ``method.credit`` and take the
    method's loss mask into ``response_mask``: a branch's copied prefix gets no loss, as in
    the local trainer."""
    mask = data.batch["response_mask"]
    if method.distilled:
        # OPD's advantage, log pi_T - log pi_S, is verl's distillation loss's own (config.py), from
        # the teacher's log-probs in the batch; OPD.credit would need a teacher in this process.
        # With use_task_rewards=false verl's PPO loss on these zeros is computed and dropped. OPD
        # trains every model token: the loss mask stays verl's, the rollouts' model-token mask.
        data.batch["advantages"] = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        data.batch["returns"] = data.batch["advantages"].clone()
        return
    groups, rows = groups_of(data, ref_kl=registry.reward_kl(method) > 0)
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
