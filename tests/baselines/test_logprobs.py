"""Log-probs of a model on finished rollouts' model tokens, through the trainer's padded batches."""
import numpy as np

from cbpo.logprobs import model_token_logprobs


def test_padded_micro_batches_give_each_rollouts_own_log_probs(trajectory, policy, tokenizer, logprobs_by_hand):
    trajs = [trajectory([3, (7, 7), 2], prompt=(1, 2, 3)), trajectory([1], prompt=(4,)), trajectory([2, (8,), 1, (7,), 3], prompt=(5, 6))]
    out = model_token_logprobs(policy, trajs, tokenizer.pad_token_id, temperature=0.7, micro_batch=2)
    for t, lp in zip(trajs, out):
        expected = logprobs_by_hand(policy, t.prompt_ids, t.response_ids, 0.7)[t.model_positions()]
        np.testing.assert_allclose(lp, expected, atol=1e-5)
