"""The credit simulator (cbpo/lab/credit_sim.py) trains with the suite's own branching and
credit, measures where branches start, and prints its table from the command line."""
import numpy as np
import pytest

import cbpo.branching
import cbpo.credit
from cbpo.lab import credit_sim
from cbpo.lab.credit_sim import Training, World, train

QUICK = Training(max_steps=40, report_at=5)


def test_it_calls_the_suites_own_branching_and_credit(monkeypatch):
    calls = []

    def spy(name, real):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return wrapped

    assert credit_sim.plan_branches is cbpo.branching.plan_branches
    assert credit_sim.assign_credit is cbpo.credit.assign_credit
    assert credit_sim.grpo_advantages is cbpo.credit.grpo_advantages
    for name in ("plan_branches", "assign_credit", "grpo_advantages"):
        monkeypatch.setattr(credit_sim, name, spy(name, getattr(credit_sim, name)))
    world = World(decisions=2, choices=3)
    train(world, "cbpo-boundary", Training(max_steps=1, report_at=0), seed=0)
    assert calls.count("plan_branches") == Training.problems and calls.count("assign_credit") == 1
    calls.clear()
    train(world, "grpo", Training(max_steps=1, report_at=0), seed=0)
    assert calls == ["grpo_advantages"] * Training.problems


def test_a_branch_copies_what_lies_before_its_point_and_resamples_the_rest():
    world = World(decisions=3, choices=4, execution=2)  # decisions at tokens 0, 3, 6
    probs = np.full((3, 4), 0.25)
    parent_c, parent_e = np.array([1, 2, 3]), np.array([True, False, True])
    rng = np.random.default_rng(0)
    for b in (1, 3, 4, 6):
        seen = {tuple(credit_sim.branch(world, parent_c, parent_e, b, probs, rng)[0]) for _ in range(200)}
        kept = int((world.positions < b).sum())
        assert {c[:kept] for c in seen} == {tuple(parent_c[:kept])}
        assert len({c[kept:] for c in seen}) > 1  # the rest is drawn again


def test_the_paper_settings_never_branch_here_and_the_controls_branch_where_they_say():
    # 30 execution tokens between decisions: Eq. 5's grid (d_min = 64) puts no window on a decision
    # more uncertain than the opening, and alpha = 0.2 < kappa = 0.25, so CBPO fills every slot.
    world = World(decisions=4, choices=3)
    assert train(world, "cbpo", QUICK, seed=0).branches == 0
    boundary = train(world, "cbpo-boundary", QUICK, seed=0)
    assert boundary.branches > 0 and boundary.at_decision == boundary.branches  # every tool boundary precedes a decision
    oracle = train(world, "oracle", QUICK, seed=0)
    assert oracle.branches > 0 and oracle.below_failed == 0  # it knows the right choices
    assert 0 < train(world, "random", QUICK, seed=0).below_failed


def test_a_run_learns_every_decision_and_is_reproducible():
    world = World(decisions=2, choices=2)
    run = train(world, "grpo", Training(max_steps=300, report_at=10), seed=3)
    assert run.steps_to_target is not None and run.steps_to_target < 300
    assert run == train(world, "grpo", Training(max_steps=300, report_at=10), seed=3)


def test_the_command_prints_a_row_per_setting_and_method(capsys):
    credit_sim.main(["--decisions", "1,2", "--choices", "2", "--seeds", "2", "--methods", "grpo,oracle",
                     "--max-steps", "30", "--report-at", "3"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "method" not in line and "---" not in line]
    assert len(rows) == 4 and all("| all |" in r for r in rows)
    assert "2 seeds" in out
    with pytest.raises(SystemExit):
        credit_sim.main(["--methods", "grpo,nope"])


def test_branching_only_where_no_observation_shows_a_dead_end():
    # cbpo-alive offers plan_branches only the tool boundaries before a dead end an observation
    # shows: with every dead end shown no branch keeps a wrong choice; with none shown it is
    # cbpo-boundary
    shown = train(World(decisions=4, choices=3, reveal=1.0), "cbpo-alive", QUICK, seed=0)
    assert shown.branches > 0 and shown.below_failed == 0 and shown.at_decision == shown.branches
    hidden = train(World(decisions=4, choices=3, reveal=0.0), "cbpo-alive", QUICK, seed=0)
    assert hidden.below_failed > 0
