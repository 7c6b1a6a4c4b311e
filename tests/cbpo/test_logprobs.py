"""The batch layout and forward pass every log-prob in the suite goes through (cbpo/logprobs.py)."""
import numpy as np
import pytest
import torch

from cbpo.logprobs import prefix_tree_tensors, rollout_tensors, token_logprobs, tree_token_logprobs, update_tensors
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


def _rows():
    """Two prompts; under the first, two parents that share their first tokens by chance and a
    branch that copies the first parent's prefix up to an observation; one empty response."""
    p1, p2 = [5, 6, 7], [9, 5]
    return [Trajectory(p1, [8, 9, 10, 11], [True, True, False, True]),
            Trajectory(p1, [8, 9, 12], [True, True, True]),
            Trajectory(p1, [8, 9, 10, 13, 14], [True, True, False, True, True], kind="branch", parent=0, at=2),
            Trajectory(p2, [8, 15], [True, True]),
            Trajectory(p2, [], [])]


def test_prefix_tree_merges_what_rows_share_and_keeps_each_rows_positions():
    rows = _rows()
    credits = [(np.ones(t.n_model_tokens), np.ones(t.n_model_tokens)) for t in rows]
    batch = prefix_tree_tensors(rows, credits, pad_id=0)
    # tree 0: 5 6 7 8 9 10 11 12 13 14 (10 nodes for 3 + 12 tokens); tree 1: 9 5 8 15, padded
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [9, 5, 8, 15, 0, 0, 0, 0, 0, 0]]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 5, 6, 7]
    visible = batch["visible"][0, 0]
    assert visible[9].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 8, 9]  # 14 sees its own path only
    assert not visible[7, 5] and visible[7, 4]  # 12 branches off after 9: it does not see 10
    assert batch["visible"][1, 0, 5].nonzero().flatten().tolist() == [5]  # padding sees itself only
    # response token j of a row is predicted at the node of the token before it
    assert batch["node"][2].tolist() == [2, 3, 4, 5, 8] and batch["target"][2].tolist() == [8, 9, 10, 13, 14]
    assert batch["row_tree"].tolist() == [0, 0, 0, 1, 1] and batch["lengths"].tolist() == [4, 3, 5, 2, 0]
    plain = rollout_tensors(rows, credits, pad_id=0)
    assert torch.equal(batch["loss_mask"], plain["loss_mask"]) and batch["n_resp"] == plain["n_resp"]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_logprobs_and_gradient_equal_one_padded_row_each(tokenizer, tiny_causal_lm, attention):
    # #37 item 3: the shared prefix runs once, yet every row's log-probs and the gradient of a
    # token-mean loss over them are those of the padded layout, within 1e-5 in float32.
    model = tiny_causal_lm(tokenizer)
    model.config._attn_implementation = attention
    rows = _rows()
    rng = np.random.default_rng(0)
    credits = [(rng.normal(size=t.n_model_tokens), np.ones(t.n_model_tokens)) for t in rows]
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            batch = prefix_tree_tensors(rows, credits, pad_id=0)
            logp = tree_token_logprobs(model, batch)
        else:
            batch = rollout_tensors(rows, credits, pad_id=0)
            logp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["n_resp"])
        mask = batch["loss_mask"]
        loss = -(logp * batch["advantages"] * mask).sum() / mask.sum()
        loss.backward()
        results.append(((logp * mask).detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp, grad), (tree_lp, tree_grad) = results
    assert grad.abs().max() > 1e-3
    assert torch.allclose(tree_lp, lp, atol=1e-5, rtol=0)
    assert torch.allclose(tree_grad, grad, atol=1e-5, rtol=0)


def test_update_tensors_picks_trees_where_sharing_outweighs_their_dense_attention(tokenizer, tiny_causal_lm):
    config = tiny_causal_lm(tokenizer).config
    prompt = list(range(5, 45))

    def rows(resp):
        return [Trajectory(prompt, [50 + k] * resp, [True] * resp) for k in range(8)]

    def layout(trajs, shared=True):
        batch = update_tensors(trajs, [(np.ones(t.n_model_tokens), np.ones(t.n_model_tokens)) for t in trajs], 0, config, shared)
        return "tree" if "visible" in batch else "padded"

    assert layout(rows(4)) == "tree"  # a 40-token prompt under short responses: computed once
    assert layout(rows(400)) == "padded"  # 8 x 400 nodes attending densely cost more than the prompt saves
    assert layout(rows(4), shared=False) == "padded"
    config._attn_implementation = "flash_attention_2"  # its kernels take no 4-D mask
    assert layout(rows(4)) == "padded"
