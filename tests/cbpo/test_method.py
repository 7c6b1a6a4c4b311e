"""CBPO and GRPO as training methods behind the registry, with a scripted sampler."""
from dataclasses import replace

import numpy as np
import pytest

from cbpo import registry
from cbpo.registry import get_method, known_methods
from cbpo.trajectory import Trajectory


def scripted_sampler(calls):
    """Completes each trajectory with 40 model tokens (an observation run after token 10);
    entropy spikes at tokens 24-27 so Stage 1 has a clear best candidate."""

    def sample(trajs):
        calls.append([t.kind for t in trajs])
        out = []
        for t in trajs:
            n_have = t.n_model_tokens
            ids, mask, ent = list(t.response_ids), list(t.model_mask), list(t.entropies)
            for pos in range(n_have, 40):
                if pos == 10 and (not mask or mask[-1]):
                    ids += [99, 99]
                    mask += [False, False]
                    ent += [0.0, 0.0]
                ids.append(5)
                mask.append(True)
                ent.append(3.0 if 24 <= pos < 28 else 0.1)
            out.append(Trajectory(t.prompt_ids, ids, mask, [0.0] * len(ids), ent, finish="answer", kind=t.kind, parent=t.parent, at=t.at))
        return out

    return sample


def test_registry_names_unknown_methods():
    assert {"grpo", "cbpo"} <= set(known_methods())
    with pytest.raises(KeyError, match="unknown method 'ppo2'"):
        get_method("ppo2")


def test_cbpo_collect_samples_parents_then_one_batched_call():
    calls = []
    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8)
    groups = cbpo.collect([[1, 2], [3]], scripted_sampler(calls))
    assert len(calls) == 2  # parents, then every branch and filler of the step at once
    assert calls[0] == ["parent"] * 4
    assert [len(g) for g in groups] == [8, 8]
    for g in groups:
        branches = [t for t in g if t.kind == "branch"]
        assert branches, "the entropy spike should attract branches"
        assert all(t.at == 24 for t in branches[:1])
        for t in branches:
            parent = g[t.parent]
            cut = int(parent.model_positions()[t.at])
            assert t.response_ids[:cut] == parent.response_ids[:cut]  # exact prefix, observation included
    # Credit: every rollout gets one advantage per model token; copied prefixes masked.
    rng = np.random.default_rng(0)
    for g in groups:
        for t in g:
            t.reward = float(rng.integers(0, 2))
    credits = cbpo.credit(groups)
    for g, cg in zip(groups, credits):
        for t, (adv, mask) in zip(g, cg):
            assert len(adv) == len(mask) == t.n_model_tokens
            if t.kind == "branch":
                assert not mask[: t.at].any() and mask[t.at :].all()


def test_grpo_collects_m_fresh_rollouts_and_broadcasts_advantage():
    calls = []
    grpo = get_method("grpo")(budget=4)
    groups = registry.collect(grpo, [[1], [2]], scripted_sampler(calls), None)  # the default collect
    assert len(calls) == 1 and [len(g) for g in groups] == [4, 4]
    for g in groups:
        for t, r in zip(g, [1, 0, 0, 0]):
            t.reward = float(r)
    (adv, mask), *_ = grpo.credit(groups)[0]
    assert np.allclose(adv, adv[0]) and adv[0] > 0 and mask.all()


def test_cbpo_rollout_info_names_candidates_and_chosen_nodes():
    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8)
    groups = cbpo.collect([[1, 2]], scripted_sampler([]))
    for t, r in zip(groups[0], [1, 0, 1, 0, 1, 0, 0, 1]):
        t.reward = float(r)
    cbpo.credit(groups)
    info = cbpo.rollout_info(groups)[0]
    parents = [row for t, row in zip(groups[0], info) if t.kind == "parent"]
    assert all(row["candidates"] == [8, 16, 24] for row in parents)  # top-3 of 8, 16, 24, 32; ties keep earlier
    chosen = {(t.parent, t.at) for t in groups[0] if t.kind == "branch"}
    assert {(i, b) for i, row in enumerate(parents) for b in row["chosen"]} == chosen
    assert all(len(row["nodes"]) == len(row["chosen"]) for row in parents)
    assert all(row == {} for t, row in zip(groups[0], info) if t.kind != "parent")


def streaming_sampler(events):
    """A sampler like the trainer's ``run_agent`` with ``follow_up``: it completes one
    trajectory at a time, first come first served, and queues follow-ups behind the rest."""
    complete = scripted_sampler([])

    def sample(trajs, follow_up):
        queue, n_done = list(trajs), 0
        events.append(("call", len(trajs)))
        while queue:
            (t,) = complete([queue.pop(0)])
            events.append(("done", t.prompt_ids[0], t.kind))
            more = follow_up(n_done, t)
            n_done += 1
            if more:
                events.append(("admit", t.prompt_ids[0], [u.kind for u in more]))
            queue += more
        return []

    return sample


def test_cbpo_starts_a_problems_branches_once_its_own_parents_are_done():
    events = []
    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8)
    groups = cbpo.collect([[1, 2], [3]], streaming_sampler(events))
    assert events.count(("call", 4)) == 1 and sum(e[0] == "call" for e in events) == 1  # one running batch
    second = events.index(next(e for e in events if e[0] == "admit" and e[1] == 1))
    assert ("done", 3, "parent") in events[second:]  # problem 2's parents still running
    assert [len(g) for g in groups] == [8, 8] and len(cbpo.last_plans) == 2
    phased = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8).collect([[1, 2], [3]], scripted_sampler([]))
    for g, h in zip(groups, phased):
        assert [(t.kind, t.parent, t.at, t.response_ids) for t in g] == [(t.kind, t.parent, t.at, t.response_ids) for t in h]


@pytest.mark.parametrize("dead_end, branches_at", [(None, {10}), (10, set())], ids=["alive", "after a dead end"])
def test_cbpo_alive_boundary_branches_only_before_an_observation_that_showed_a_dead_end(dead_end, branches_at):
    """The scripted responses resume after their one observation at model token 10; with alpha
    above kappa that boundary is a branch point unless its observation showed a dead end."""
    calls = []
    sample = scripted_sampler(calls)

    def marking(trajs):
        out = sample(trajs)
        for t in out:
            t.dead_ends = [] if dead_end is None else [dead_end]
        return out

    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8, candidates="alive_boundary", alpha=0.9)
    (group,) = cbpo.collect([[1, 2]], marking)
    assert {t.at for t in group if t.kind == "branch"} == branches_at
    if dead_end is not None:  # no candidate left: every slot past the parents is a filler
        assert sum(t.kind == "fill" for t in group) == 6


@pytest.mark.parametrize("dead_end, frontier", [(None, [30]), (30, [20]), (20, [10]), (10, [])],
                         ids=["alive", "dead end after the third", "after the second", "after the first"])
def test_the_frontier_is_the_last_boundary_before_a_dead_end(dead_end, frontier):
    """Three observations, the model resuming at model tokens 10, 20 and 30: alive_boundary offers
    those before the first dead end, frontier_boundary only the last of them, which is where
    CBPO then branches (alpha above kappa)."""
    ids, mask = [], []
    for pos in range(40):
        if pos in (10, 20, 30):
            ids, mask = ids + [99, 99], mask + [False, False]
        ids, mask = ids + [5], mask + [True]
    parent = Trajectory([1, 2], ids, mask, [0.0] * len(ids), [0.1] * len(ids), finish="answer",
                        dead_ends=[] if dead_end is None else [dead_end])
    assert parent.tool_boundaries() == [10, 20, 30]
    assert parent.frontier_boundaries() == frontier == parent.alive_boundaries()[-1:]

    def sample(trajs):  # parents come back as `parent`; branches are finished as they are
        return [replace(parent) if t.kind == "parent" else replace(t, finish="answer") for t in trajs]

    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8, candidates="frontier_boundary", alpha=0.9)
    (group,) = cbpo.collect([[1, 2]], sample)
    assert {t.at for t in group if t.kind == "branch"} == set(frontier)
