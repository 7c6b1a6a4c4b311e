"""Rollout groups for the verl backend's tests, built by hand: what verl's batch carries is
compared with what the local trainer computes from the same trajectories; and the process
environment restored after every test."""
import os

import numpy as np
import pytest
import torch

from cbpo.backends.verl import credit
from cbpo.trajectory import Trajectory


@pytest.fixture(autouse=True)
def _environment_restored():
    """A launch run in-process (``run_verl`` on CPU) sets VERL_PLATFORM and the other variables
    of cbpo/backends/verl/cpu.py for good; the next test's subprocesses would inherit them
    (test_verl_cpu_platform's checks of verl's own platform did, when run after it)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def rollout(rng, n_model: int, reward: float) -> Trajectory:
    """A response of ``n_model`` model tokens with an observation run after every 5th."""
    ids, mask = [], []
    for k in range(n_model):
        ids.append(int(rng.integers(3, 50)))
        mask.append(True)
        if k % 5 == 4 and k < n_model - 1:
            ids += [1, 2, 1]
            mask += [False] * 3
    return Trajectory(prompt_ids=[7, 8, 9], response_ids=ids, model_mask=mask, logprobs=[0.0] * len(ids),
                      entropies=rng.random(len(ids)).tolist(), finish="answer", reward=reward,
                      tool_calls=(n_model - 1) // 5, tool_seconds=0.5)


def grow(rng, prefix: Trajectory, n_new: int, reward: float) -> Trajectory:
    tail = rollout(rng, n_new, reward)
    prefix.response_ids += tail.response_ids
    prefix.model_mask += tail.model_mask
    prefix.logprobs += tail.logprobs
    prefix.entropies += tail.entropies
    prefix.finish, prefix.reward = "answer", reward
    return prefix


@pytest.fixture()
def cbpo_groups() -> list[list[Trajectory]]:
    """Two problems of M = 8: parents, branches at model tokens 4/8 (several at one node),
    fillers; rewards mixed so CBV and the segment credit are not trivial."""
    rng = np.random.default_rng(0)
    groups = []
    for g in range(2):
        parents = [rollout(rng, 12 + 3 * i, float((i + g) % 2)) for i in range(3)]
        branches = [grow(rng, parents[0].branch_prefix(4, 0), 6, 1.0), grow(rng, parents[0].branch_prefix(4, 0), 5, 0.0),
                    grow(rng, parents[0].branch_prefix(8, 0), 4, float(g)), grow(rng, parents[1].branch_prefix(4, 1), 7, 1.0)]
        fill = [rollout(rng, 9, 0.0)]
        for t in fill:
            t.kind = "fill"
        groups.append(parents + branches + fill)
    return groups


@pytest.fixture()
def verl_batch():
    """``make(groups, width=None, order=None, fields=None)``: the rollouts as verl's trainer holds
    them when it computes advantages: prompts padded on the left and responses (observations
    included) on the right to verl's fixed widths (``width``: the longest response + 3),
    ``attention_mask`` over both, the model-token ``response_mask``, the reward on the last
    response token, rows in ``order`` (verl's batch balancing reorders them; default: reversed),
    and in non_tensor_batch the uid and the agent loop's credit fields, plus ``fields(g, k, t)``'s."""
    verl = pytest.importorskip("verl")

    def make(groups, width=None, order=None, fields=None):
        flat = [(g, k, t) for g, group in enumerate(groups) for k, t in enumerate(group)]
        flat = [flat[i] for i in (range(len(flat))[::-1] if order is None else order)]
        width = width or max(len(t.response_ids) for _, _, t in flat) + 3
        prompt_width = max(len(t.prompt_ids) for _, _, t in flat)
        shape = (len(flat), width)
        responses, mask = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
        attention, rewards = torch.zeros((len(flat), prompt_width + width), dtype=torch.int64), torch.zeros(shape)
        for row, (_, _, t) in enumerate(flat):
            n = len(t.response_ids)
            responses[row, :n] = torch.tensor(t.response_ids, dtype=torch.int64)
            mask[row, :n] = torch.tensor(t.model_mask, dtype=torch.int64)
            attention[row, prompt_width - len(t.prompt_ids): prompt_width + n] = 1
            rewards[row, n - 1] = t.reward
        extra = [{**credit.rollout_fields(t, k), **(fields(g, k, t) if fields else {})} for g, k, t in flat]

        def column(name):
            out = np.empty(len(flat), dtype=object)
            out[:] = [f[name] for f in extra]
            return out

        non_tensor = {"uid": np.array([f"problem-{g}" for g, _, _ in flat], dtype=object), **{n: column(n) for n in extra[0]}}
        return verl.DataProto.from_dict(
            tensors={"responses": responses, "response_mask": mask, "attention_mask": attention, "token_level_scores": rewards},
            non_tensors=non_tensor)

    return make
