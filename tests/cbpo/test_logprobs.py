"""The batch layout and forward pass every log-prob in the suite goes through (cbpo/logprobs.py)."""
import numpy as np
import torch

from cbpo.logprobs import rollout_tensors, token_logprobs
from cbpo.trajectory import Trajectory


def test_rollout_tensors_align_model_tokens(model, tokenizer):
    a = Trajectory([5, 6, 7], [8, 9, 10, 11], [True, False, False, True], [-1.0] * 4, [0.5] * 4)
    b = Trajectory([5], [12, 13], [True, True], [-1.0] * 2, [0.5] * 2)
    batch = rollout_tensors([a, b], [(np.array([0.5, 0.7]), np.array([1, 1])), (np.array([-1.0, 2.0]), np.array([0, 1]))], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11], [0, 0, 5, 12, 13, 0, 0]]
    assert np.allclose(batch["advantages"].numpy(), [[0.5, 0, 0, 0.7], [-1.0, 2.0, 0, 0]])
    assert batch["loss_mask"].tolist() == [[1, 0, 0, 1], [0, 1, 0, 0]]
    # Left padding leaves the response log-probs unchanged (position ids from the mask).
    lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["n_resp"])
    alone = token_logprobs(model, torch.tensor([[5, 12, 13]]), torch.ones(1, 3, dtype=torch.long), 2)
    assert torch.allclose(lp[1, :2], alone[0], atol=1e-5)
