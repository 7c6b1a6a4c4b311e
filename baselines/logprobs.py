"""Log-probabilities a model gives the model tokens of finished rollouts, for methods whose
credit needs a second opinion on the sampled tokens (OPD's teacher, OC-GRPO's hint-free
context). The tensors and the forward pass are the trainer's own, imported when called: the
Snakefile loads every method's module (for its registry entry) and should not pay for torch."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from cbpo.trajectory import Trajectory


def model_token_logprobs(model, trajs: Sequence[Trajectory], pad_id: int, temperature: float = 1.0, micro_batch: int = 16) -> list[np.ndarray]:
    """log p(y_t | prompt, y_<t) of every model token of each rollout, at ``temperature``, in
    model-token order (observation tokens are context only)."""
    import torch

    from cbpo.trainer import rollout_tensors, token_logprobs

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
