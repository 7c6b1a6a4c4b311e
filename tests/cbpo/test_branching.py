"""Stage 1 (Eqs. 5-10, Algorithm 1 lines 9-22) against hand-worked examples and invariants."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbpo.branching import (
    allocate_branches,
    balanced_priority,
    candidate_boundaries,
    plan_branches,
    raw_priority,
    scan_parent,
    window_entropy,
)
from cbpo.config import CBPOConfig


def test_candidate_boundaries_eq5_only_where_window_fits():
    assert candidate_boundaries(200, 20, 64).tolist() == [64, 128]  # 192 + 20 > 200
    assert candidate_boundaries(212, 20, 64).tolist() == [64, 128, 192]  # 192 + 20 == 212 fits
    assert candidate_boundaries(83, 20, 64).tolist() == []


def test_window_entropy_eq6_normalises_by_window_and_log_vocab():
    ent = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    h = window_entropy(ent, np.array([0, 2, 3]), w=3, vocab_size=8)
    assert h == pytest.approx(np.array([6.0, 12.0, 15.0]) / (3 * math.log(8)))


def test_raw_priority_eq9_clips_to_unit_interval():
    p = raw_priority(np.array([0.0, 0.1, 0.5, -0.5]), h_root=0.1, alpha=0.2, gamma=2.0)
    assert p == pytest.approx([0.0, 0.2, 1.0, 0.0])


def test_balanced_priority_eq10():
    p = balanced_priority(np.array([0.8]), np.array([1]), np.array([2]), 0.2, 0.5)
    assert p[0] == pytest.approx(0.8 / (2**0.2 * 3**0.5))


def test_scan_parent_hand_worked():
    # w = 4, d_min = 4, |V| = 1000: windows at 0, 4, 8, 12, 16 have entropy sums
    # 0.4, 4, 8, 0, 12  ->  dH relative to the root window, P = clip(0.2 + 2 dH).
    cfg = CBPOConfig(w=4, d_min=4)
    ent = [0.1] * 4 + [1.0] * 4 + [2.0] * 4 + [0.0] * 4 + [3.0] * 4
    cands = scan_parent(ent, 1000, cfg)
    norm = 4 * math.log(1000)
    expect = {b: min(1.0, max(0.0, 0.2 + 2 * (s - 0.4) / norm)) for b, s in [(4, 4), (8, 8), (16, 12)]}
    assert cands.positions.tolist() == [4, 8, 16]  # top-3 of 4 candidates, in position order
    assert cands.priority == pytest.approx([expect[4], expect[8], expect[16]])


def test_top_j_ties_keep_earlier_positions():
    cfg = CBPOConfig(w=2, d_min=2, top_j=2)
    ent = [0.0, 0.0] + [1.0] * 10  # every candidate window has the same entropy
    assert scan_parent(ent, 50, cfg).positions.tolist() == [2, 4]


def test_short_parent_and_tool_boundary_candidates():
    cfg = CBPOConfig(w=4, d_min=4, candidates="tool_boundary")
    assert scan_parent([1.0] * 3, 100, cfg).positions.size == 0
    ent = [0.0] * 4 + [1.0] * 12
    # b = 0 is the root, 14 does not fit (14 + 4 > 16), 5 and 9 are kept.
    assert scan_parent(ent, 100, cfg, tool_boundaries=[0, 5, 9, 14]).positions.tolist() == [5, 9]
    assert scan_parent(ent, 100, cfg, tool_boundaries=[]).positions.size == 0


def test_allocation_hand_worked_decay_caps_and_kappa():
    cfg = CBPOConfig(w=4, d_min=4)
    ent_a = [0.1] * 4 + [1.0] * 4 + [2.0] * 4 + [0.0] * 4 + [3.0] * 4
    ent_b = [0.5] * 12  # flat: P^raw = alpha = 0.2 <= kappa, never branched
    plan = plan_branches([ent_a, ent_b], 1000, cfg, budget=8)
    # P(16) = 1.0, P(8) ~ 0.75: 16 wins while 1/((1+L)(1+l))^0.2 beats 0.75/(1+L)^0.2,
    # until node 16 hits B_node = 3; then 8; then path a hits B_path = 4 and b is below kappa.
    assert plan.branches == [(0, 16), (0, 16), (0, 16), (0, 8)]
    assert plan.fill == 2


def test_without_decay_allocation_concentrates_on_top_node():
    cfg = CBPOConfig(w=4, d_min=4, rho_path=0.0, rho_node=0.0, b_path=10, b_node=10)
    ent = [0.1] * 4 + [1.0] * 4 + [2.0] * 4 + [0.0] * 4 + [3.0] * 4
    plan = plan_branches([ent], 1000, cfg, budget=6)
    assert plan.branches == [(0, 16)] * 5 and plan.fill == 0


def test_argmax_ties_go_to_earlier_parent_then_position():
    cfg = CBPOConfig(w=2, d_min=2, b_node=1, b_path=1)
    ent = [0.0, 0.0] + [1.0] * 6
    plan = plan_branches([ent, ent], 10, cfg, budget=4)
    assert plan.branches == [(0, 2), (1, 2)]


def test_kappa_is_strict():
    cfg = CBPOConfig(w=2, d_min=2, kappa=0.2)
    plan = plan_branches([[1.0] * 8], 10, cfg, budget=4)  # flat: P^raw == alpha == kappa
    assert plan.branches == [] and plan.fill == 3


def test_more_parents_than_budget_is_an_error():
    with pytest.raises(ValueError, match="budget"):
        allocate_branches([], -1, CBPOConfig())


profiles = st.lists(st.lists(st.floats(0, 5, allow_nan=False), min_size=0, max_size=300), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(profiles, st.integers(8, 20), st.sampled_from(["full", "tool_boundary"]), st.floats(0, 1), st.floats(0, 1))
def test_every_problem_gets_exactly_m_rollouts(ents, budget, source, rho_path, rho_node):
    cfg = CBPOConfig(w=5, d_min=16, candidates=source, rho_path=rho_path, rho_node=rho_node)
    tools = [list(range(3, len(e), 7)) for e in ents]
    plan = plan_branches(ents, 64, cfg, tool_boundaries=tools, budget=budget)
    assert len(ents) + len(plan.branches) + plan.fill == budget
    per_path, per_node = {}, {}
    for i, b in plan.branches:
        per_path[i] = per_path.get(i, 0) + 1
        per_node[(i, b)] = per_node.get((i, b), 0) + 1
        assert 0 < b and b + cfg.w <= len(ents[i])
    assert max(per_path.values(), default=0) <= cfg.b_path
    assert max(per_node.values(), default=0) <= cfg.b_node
