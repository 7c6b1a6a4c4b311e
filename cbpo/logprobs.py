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


def prefix_tree_tensors(trajs: Sequence[Trajectory], credits, pad_id: int, device: torch.device | str = "cpu",
                        cheaper_for=None) -> dict | None:
    """The rows of :func:`rollout_tensors` (same advantages, loss mask and ``n_resp``), laid
    out for :func:`tree_token_logprobs`: the token sequences (prompt + response) of rows with
    one prompt merged into a prefix tree, one tree per batch row, so a prefix that several rows
    share (their prompt; a branch's copied prefix and its parent's) is one set of nodes. A node
    attends to itself and its ancestors and sits at its depth; tree rows are right-padded with
    nodes that attend only to themselves. ``node[i, j]`` is the node whose logits predict
    response token j of row i, ``target[i, j]`` that token (both 0 past the row's ``lengths``).
    With ``cheaper_for`` (a model config), None unless the trees cost that model fewer
    operations than padded rows (:func:`forward_cost`), before any dense mask is built."""
    import torch

    trees: dict[tuple[int, ...], dict] = {}
    n_resp = max(1, max(len(t.response_ids) for t in trajs))
    node = torch.zeros((len(trajs), n_resp), dtype=torch.long)
    target = torch.zeros((len(trajs), n_resp), dtype=torch.long)
    row_tree = torch.zeros(len(trajs), dtype=torch.long)
    for i, t in enumerate(trajs):
        tree = trees.setdefault(tuple(t.prompt_ids), {"index": len(trees), "children": {}, "tokens": [], "parent": []})
        row_tree[i] = tree["index"]
        here = -1  # the root: no node yet
        path = []
        for tok in [*t.prompt_ids, *t.response_ids]:
            key = (here, tok)
            if key not in tree["children"]:
                tree["children"][key] = len(tree["tokens"])
                tree["tokens"].append(tok)
                tree["parent"].append(here)
            here = tree["children"][key]
            path.append(here)
        p, r = len(t.prompt_ids), len(t.response_ids)
        node[i, :r] = torch.tensor(path[p - 1 : p + r - 1], dtype=torch.long)
        target[i, :r] = torch.tensor(t.response_ids, dtype=torch.long)
    width = max(len(tr["tokens"]) for tr in trees.values())
    if cheaper_for is not None:
        predicting = len(set(zip(row_tree[:, None].expand_as(node).flatten().tolist(), node.flatten().tolist())))
        padded = forward_cost(cheaper_for, len(trajs), max(len(t.prompt_ids) for t in trajs) + n_resp, len(trajs) * (n_resp + 1))
        if forward_cost(cheaper_for, len(trees), width, predicting) >= padded:
            return None
    ids = torch.full((len(trees), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(trees), width), dtype=torch.long)
    visible = torch.zeros((len(trees), width, width), dtype=torch.bool)
    for tr in trees.values():
        k, n = tr["index"], len(tr["tokens"])
        ids[k, :n] = torch.tensor(tr["tokens"])
        for m, up in enumerate(tr["parent"]):  # parents come first: a node sees what its parent sees, and itself
            if up >= 0:
                visible[k, m] = visible[k, up]
                pos[k, m] = pos[k, up] + 1
            visible[k, m, m] = True
        visible[k, range(n, width), range(n, width)] = True
    blank = rollout_tensors(trajs, credits, pad_id)
    lengths = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.long)
    tensors = {"input_ids": ids, "position_ids": pos, "visible": visible[:, None], "row_tree": row_tree, "node": node,
               "target": target, "lengths": lengths, "advantages": blank["advantages"], "loss_mask": blank["loss_mask"]}
    return {**{k: v.to(device) for k, v in tensors.items()}, "n_resp": n_resp}


def tree_token_logprobs(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """:func:`token_logprobs` of the rows of a :func:`prefix_tree_tensors` batch ([rows,
    n_resp], 0 past each response): one forward pass over the trees, so a shared prefix is run
    once in the forward and the backward (PrefixGrouper, arXiv 2506.05433), and logits only at
    the nodes that predict a response token."""
    import torch

    visible = batch["visible"]
    if model.config._attn_implementation != "sdpa":  # eager attention adds its mask to the scores
        visible = torch.zeros(visible.shape, dtype=model.dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(model.dtype).min)
    hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=visible,
                                 position_ids=batch["position_ids"]).last_hidden_state
    rows = batch["row_tree"][:, None].expand_as(batch["node"])
    used, inverse = torch.unique(torch.stack([rows, batch["node"]]).flatten(1), dim=1, return_inverse=True)
    logits = model.get_output_embeddings()(hidden[used[0], used[1]]).float() / temperature
    logp = torch.log_softmax(logits, -1)[inverse, batch["target"].flatten()].view_as(batch["node"])
    width = torch.arange(batch["node"].shape[1], device=logp.device)
    return logp.masked_fill(width[None] >= batch["lengths"][:, None], 0.0)


def forward_cost(config, rows: int, width: int, logits: int) -> float:
    """Multiply-adds of a forward pass over ``rows`` sequences of ``width`` positions (per layer
    and position the projections, ~4 d^2, and the gated MLP, 3 d x intermediate; per attended
    pair 2 d, dense as sdpa computes a masked or padded batch) and of ``logits`` rows of the
    output layer: the scale on which :func:`update_tensors` picks a layout."""
    d = config.hidden_size
    per_position = 4 * d * d + 3 * d * getattr(config, "intermediate_size", 4 * d) + 2 * width * d
    return config.num_hidden_layers * rows * width * per_position + logits * d * config.vocab_size


def update_tensors(trajs: Sequence[Trajectory], credits, pad_id: int, config, shared: bool,
                   device: torch.device | str = "cpu") -> dict:
    """The rows in the layout their forward pass costs ``config``'s model least
    (:func:`forward_cost`): with ``shared``, prefix trees (:func:`prefix_tree_tensors`) where
    what the rows share outweighs a tree's dense attention over all its nodes; padded rows
    (:func:`rollout_tensors`) where it does not (long responses under a short prompt) or
    without ``shared`` or a mask-taking attention. Both give the same log-probs
    (:func:`update_logprobs`)."""
    # a 4-D mask is what sdpa and eager attention take; flash attention kernels take none
    masks = getattr(config, "_attn_implementation", "sdpa") in ("sdpa", "eager")
    tree = prefix_tree_tensors(trajs, credits, pad_id, device, cheaper_for=config) if shared and masks else None
    return rollout_tensors(trajs, credits, pad_id, device) if tree is None else tree


def update_logprobs(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """[rows, n_resp] log-probs of an :func:`update_tensors` batch, in its layout."""
    if "visible" in batch:
        return tree_token_logprobs(model, batch, temperature)
    return token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["n_resp"], temperature)
