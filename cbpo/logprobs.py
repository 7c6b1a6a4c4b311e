"""The policy's log-probabilities of finished rollouts: one batch layout (left-padded prompts,
right-padded responses, credit on model-token positions) and one forward pass, for the local
trainer's update and for methods whose credit needs a second opinion on the sampled tokens
(OPD's teacher, OC-GRPO's hint-free context). torch loads when called: the Snakefile loads every
method's module (for its registry entry) and should not pay for it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from cbpo.trajectory import Trajectory

if TYPE_CHECKING:
    import torch


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_resp: int, temperature: float = 1.0) -> torch.Tensor:
    """log pi_T(y_t | ...) of the last ``n_resp`` columns (left-padded prompts, right-padded
    responses), computing logits only where a response token is predicted. ``temperature``
    scales the logits as the rollouts were sampled, so the objective is on-policy for the
    sampling distribution (as verl's actor does)."""
    import torch

    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=n_resp + 1)
    logits = out.logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, -n_resp:, None]).squeeze(-1)


def rollout_tensors(trajs: Sequence[Trajectory], credits, pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses; advantages and loss masks mapped from
    model-token positions onto response positions (observation tokens get mask 0). Built on
    the CPU, moved to ``device`` once per tensor."""
    import torch

    p_max = max(len(t.prompt_ids) for t in trajs)
    r_max = max(1, max(len(t.response_ids) for t in trajs))
    b = len(trajs)
    ids = torch.full((b, p_max + r_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_max + r_max), dtype=torch.long)
    adv = torch.zeros((b, r_max))
    mask = torch.zeros((b, r_max))
    for i, (t, (a, m)) in enumerate(zip(trajs, credits)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        ids[i, p_max - p : p_max] = torch.tensor(t.prompt_ids)
        ids[i, p_max : p_max + r] = torch.tensor(t.response_ids, dtype=torch.long)
        attn[i, p_max - p : p_max + r] = 1
        pos = torch.from_numpy(t.model_positions())
        adv[i, pos] = torch.as_tensor(a, dtype=torch.float32)
        mask[i, pos] = torch.as_tensor(m, dtype=torch.float32)
    tensors = {"input_ids": ids, "attention_mask": attn, "advantages": adv, "loss_mask": mask}
    return {**{k: v.to(device) for k, v in tensors.items()}, "n_resp": r_max}


def model_token_logprobs(model, trajs: Sequence[Trajectory], pad_id: int, temperature: float = 1.0, micro_batch: int = 16) -> list[np.ndarray]:
    """log p(y_t | prompt, y_<t) of every model token of each rollout, at ``temperature``, in
    model-token order (observation tokens are context only)."""
    import torch

    device = next(model.parameters()).device
    out: list[np.ndarray] = []
    for start in range(0, len(trajs), micro_batch):
        chunk = trajs[start : start + micro_batch]
        # rollout_tensors also lays out credits; none exist yet, so zeros stand in.
        blank = [(np.zeros(t.n_model_tokens), np.zeros(t.n_model_tokens)) for t in chunk]
        batch = rollout_tensors(chunk, blank, pad_id)
        with torch.no_grad():
            logp = token_logprobs(model, batch["input_ids"].to(device), batch["attention_mask"].to(device), batch["n_resp"], temperature)
        logp = logp.double().cpu().numpy()
        out += [logp[i, t.model_positions()] for i, t in enumerate(chunk)]
    return out
