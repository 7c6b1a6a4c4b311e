"""Stage 2 (Eqs. 3, 13-19) against hand-worked examples and the paper's properties."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbpo.config import CBPOConfig
from cbpo.credit import (
    ProblemRollouts,
    assign_credit,
    contrastive_branch_value,
    exact_prefix_groups,
    grpo_advantages,
    modulate,
    segment_parent,
    standardize_cbv,
)


def test_grpo_advantage_eq3_uses_sample_std():
    a = grpo_advantages(np.array([1.0, 0.0, 0.0, 1.0]))
    assert a == pytest.approx(np.array([1, -1, -1, 1]) * 0.5 / (np.std([1, 0, 0, 1], ddof=1) + 1e-6))
    assert grpo_advantages(np.array([1.0])).tolist() == [0.0]
    assert grpo_advantages(np.array([1.0, 1.0])).tolist() == [0.0, 0.0]


def test_cbv_eq13_is_population_std():
    assert contrastive_branch_value(np.array([1.0, 0.0])) == pytest.approx(0.5)
    assert contrastive_branch_value(np.array([1.0, 1.0, 1.0])) == 0.0


def test_standardize_eq14_and_threshold():
    z = standardize_cbv(np.array([0.0, 0.5]))
    assert z == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert standardize_cbv(np.array([0.3, 0.3 + 1e-8])).tolist() == [0.0, 0.0]


def test_modulation_eqs16_17_hand_worked():
    # |A| = 1, phi = 2: C = clip(Z, -0.5, 0.5); A_final = A + 0.2 sign(A) C
    out = modulate(np.array([1.0, -1.0, 1.0, 0.0]), np.array([2.0, 2.0, -0.1, 5.0]), 0.2, 2.0)
    assert out == pytest.approx([1.1, -1.1, 0.98, 0.0])


def test_segment_parent_eq19_hand_worked():
    adv = segment_parent(10, [3, 7], shared=[0.1, 0.5], final_parent=[1.0, 2.0])
    assert adv.tolist() == pytest.approx([0.1] * 3 + [0.75] * 4 + [2.0] * 3)
    assert segment_parent(4, [2], [0.3], [0.9]).tolist() == pytest.approx([0.3, 0.3, 0.9, 0.9])


def test_exact_prefix_groups_parent_first_sorted_by_boundary():
    kinds = ["parent", "parent", "branch", "branch", "branch", "fill"]
    groups = exact_prefix_groups(kinds, np.array([-1, -1, 0, 0, 0, -1]), np.array([-1, -1, 9, 4, 9, -1]))
    assert [(p, b, m.tolist()) for p, b, m in groups] == [(0, 4, [0, 3]), (0, 9, [0, 2, 4])]


def _example():
    # Problem 0: parent 0 (R=1) with nodes at 2 (branch 2, R=0) and 5 (branches 3, 4: R=1, 0);
    # parent 1 (R=0) with no node; filler 5 (R=1). Problem 1: parent with one branch, equal R.
    p0 = ProblemRollouts(
        rewards=[1, 0, 0, 1, 0, 1],
        kinds=["parent", "parent", "branch", "branch", "branch", "fill"],
        parent=[-1, -1, 0, 0, 0, -1],
        at=[-1, -1, 2, 5, 5, -1],
        n_tokens=[8, 6, 7, 9, 6, 4],
    )
    p1 = ProblemRollouts(rewards=[1, 1], kinds=["parent", "branch"], parent=[-1, 0], at=[-1, 3], n_tokens=[5, 6])
    return [p0, p1]


def test_assign_credit_hand_worked():
    cfg = CBPOConfig()
    credit = assign_credit(_example(), cfg)
    r = np.array([1, 0, 0, 1, 0, 1.0])
    a = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    cbv = np.array([0.5, np.std([1, 1, 0]), 0.0])  # nodes (0,2), (0,5), problem 1 (0,3)
    z = (cbv - cbv.mean()) / (cbv.std() + 1e-6)
    mod = lambda adv, zi: adv + 0.2 * np.sign(adv) * np.clip(zi, -abs(adv) / 2, abs(adv) / 2)
    shared = [np.mean(a[[0, 2]]), np.mean(a[[0, 3, 4]])]
    final_parent = [mod(a[0], z[0]), mod(a[0], z[1])]
    adv = credit.advantages[0]
    # Parent 0 segmented by Eq. 19 over its 8 tokens.
    expect0 = [shared[0]] * 2 + [0.5 * (final_parent[0] + shared[1])] * 3 + [final_parent[1]] * 3
    assert adv[0] == pytest.approx(expect0)
    assert credit.loss_masks[0][0].tolist() == [1] * 8
    # Branches: prefix zero and masked, suffix A_final.
    assert adv[2].tolist() == pytest.approx([0, 0] + [mod(a[2], z[0])] * 5)
    assert credit.loss_masks[0][2].tolist() == [0, 0] + [1] * 5
    assert adv[3].tolist() == pytest.approx([0] * 5 + [mod(a[3], z[1])] * 4)
    assert adv[4].tolist() == pytest.approx([0] * 5 + [mod(a[4], z[1])] * 1)
    # Unbranched parent and filler keep the base advantage.
    assert adv[1].tolist() == pytest.approx([a[1]] * 6)
    assert adv[5].tolist() == pytest.approx([a[5]] * 4)
    # Problem 1: all rewards equal -> base advantages 0 everywhere.
    assert credit.advantages[1][0].tolist() == [0.0] * 5
    assert credit.loss_masks[1][1].tolist() == [0, 0, 0, 1, 1, 1]


def test_eta_zero_is_without_cbv():
    credit = assign_credit(_example(), CBPOConfig(eta=0.0))
    base = credit.base[0]
    assert credit.advantages[0][3][5:] == pytest.approx([base[3]] * 4)
    assert credit.advantages[0][0][-1] == pytest.approx(base[0])


def test_invalid_branch_structure_is_named():
    with pytest.raises(ValueError, match="parent"):
        ProblemRollouts([1, 0], ["fill", "branch"], [-1, 0], [-1, 1], [3, 3])
    with pytest.raises(ValueError, match="branch point"):
        ProblemRollouts([1, 0], ["parent", "branch"], [-1, 0], [-1, 7], [3, 9])
    with pytest.raises(ValueError, match="kind"):
        ProblemRollouts([1], ["leaf"], [-1], [-1], [3])


def test_pairwise_identity_eq25_and_unbiasedness_eq26():
    rng = np.random.default_rng(0)
    r = rng.random(7)
    n = r.size
    assert contrastive_branch_value(r) ** 2 == pytest.approx(((r[:, None] - r[None, :]) ** 2).sum() / (2 * n * n))
    # Binary outcomes with q = 0.3: E[n/(n-1) CBV^2] = q(1-q) = 0.21.
    n, q = 4, 0.3
    samples = (rng.random((200_000, n)) < q).astype(float)
    est = n / (n - 1) * samples.std(axis=1) ** 2
    assert est.mean() == pytest.approx(q * (1 - q), abs=3e-3)
    assert samples.std(axis=1).__pow__(2).mean() == pytest.approx((n - 1) / n * q * (1 - q), abs=3e-3)


# Advantages are (R - mean) / (std + eps), never subnormal. At A = 5e-324 the float step is A itself,
# so A - eta C rounds to 0 and the sign "flips" to 0: hypothesis drew that case in one main-tier run
# of six (a test failing at random), so the property is stated for normal floats.
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-50, 50, allow_nan=False, allow_subnormal=False), min_size=1, max_size=40),
    st.floats(-100, 100, allow_nan=False),
    st.floats(0, 1.99),
    st.floats(0.01, 10),
)
def test_modulation_never_flips_sign_and_stays_bounded(advs, z, eta_frac, phi):
    eta = eta_frac * phi / 2  # 0 <= eta < phi
    a = np.array(advs)
    out = modulate(a, z, eta, phi)
    assert np.all(np.sign(out) == np.sign(a))
    mag = np.abs(a)
    assert np.all(np.abs(out) >= (1 - eta / phi) * mag - 1e-9)
    assert np.all(np.abs(out) <= (1 + eta / phi) * mag + 1e-9)


@st.composite
def problem_sets(draw):
    problems = []
    for _ in range(draw(st.integers(1, 4))):
        n_par = draw(st.integers(1, 4))
        kinds, parent, at, n_tok = [], [], [], []
        for _ in range(n_par):
            kinds.append("parent"), parent.append(-1), at.append(-1), n_tok.append(draw(st.integers(1, 60)))
        for _ in range(draw(st.integers(0, 10))):
            p = draw(st.integers(0, n_par - 1))
            b = draw(st.integers(0, n_tok[p] - 1))
            kinds.append("branch"), parent.append(p), at.append(b), n_tok.append(b + draw(st.integers(0, 30)))
        for _ in range(draw(st.integers(0, 3))):
            kinds.append("fill"), parent.append(-1), at.append(-1), n_tok.append(draw(st.integers(1, 20)))
        rewards = draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=len(kinds), max_size=len(kinds)))
        problems.append(ProblemRollouts(rewards, kinds, parent, at, n_tok))
    return problems


@settings(max_examples=150, deadline=None)
@given(problem_sets())
def test_each_parent_token_lies_in_exactly_one_segment(problems):
    credit = assign_credit(problems)
    nodes_by_parent = {}
    for nd in credit.nodes:
        nodes_by_parent.setdefault((nd.problem, nd.parent), []).append(nd)
    for x, prob in enumerate(problems):
        for k, kind in enumerate(prob.kinds):
            adv, mask = credit.advantages[x][k], credit.loss_masks[x][k]
            assert len(adv) == len(mask) == prob.n_tokens[k]
            if kind == "branch":
                assert not mask[: prob.at[k]].any() and mask[prob.at[k] :].all()
                assert not adv[: prob.at[k]].any()
                continue
            assert mask.all()
            own = nodes_by_parent.get((x, k))
            if not own:
                assert np.all(adv == credit.base[x][k])
                continue
            # Segment ids from the boundaries: every token gets exactly one, and each segment is
            # constant with the Eq. 19 value.
            bounds = [nd.at for nd in own]
            seg = np.searchsorted(bounds, np.arange(prob.n_tokens[k]), side="right")
            values = [own[0].shared] + [0.5 * (own[j].final[0] + own[j + 1].shared) for j in range(len(own) - 1)] + [own[-1].final[0]]
            assert adv == pytest.approx(np.array(values)[seg])


def test_cbv_for_all_groups_at_once_matches_per_group():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.25])
    node_of = np.array([0, 0, 1, 1, 1, 2])
    expect = [contrastive_branch_value(r[node_of == g]) for g in range(3)]
    assert contrastive_branch_value(r, node_of) == pytest.approx(expect)


def test_centred_root_credit_gives_the_roots_shared_opening_zero_net_credit():
    # root_credit=centred (ours, issue #36). Parent 0 (R=0) with two winning branches at 3, parent
    # 1 and the filler losing: under Eq. 3 over all five the roots' openings sum to less than zero
    problem = ProblemRollouts(rewards=[0, 0, 1, 1, 0], kinds=["parent", "parent", "branch", "branch", "fill"],
                              parent=[-1, -1, 0, 0, -1], at=[-1, -1, 3, 3, -1], n_tokens=[6, 5, 7, 4, 3])
    paper, centred = assign_credit([problem]), assign_credit([problem], CBPOConfig(root_credit="centred"))
    roots = [0, 1, 4]
    opening = [paper.advantages[0][k][0] for k in roots]
    assert sum(opening) < -0.5
    assert sum(centred.advantages[0][k][0] for k in roots) == pytest.approx(0.0, abs=1e-12)
    shift = np.mean(opening)
    # each root's opening moves by the same constant: parent 0 before its node (3 tokens), the
    # unbranched parent and the filler on every token
    assert centred.advantages[0][0] == pytest.approx(np.r_[paper.advantages[0][0][:3] - shift, paper.advantages[0][0][3:]])
    for k in (1, 4):
        assert centred.advantages[0][k] == pytest.approx(paper.advantages[0][k] - shift)
    for k in (2, 3):  # branches and every mask untouched
        assert centred.advantages[0][k].tolist() == paper.advantages[0][k].tolist()
    assert [m.tolist() for m in centred.loss_masks[0]] == [m.tolist() for m in paper.loss_masks[0]]


@settings(max_examples=100, deadline=None)
@given(problem_sets())
def test_centred_root_credit_sums_to_zero_on_every_problems_roots(problems):
    credit = assign_credit(problems, CBPOConfig(root_credit="centred"))
    first = {}
    for nd in credit.nodes:
        first.setdefault((nd.problem, nd.parent), nd.at)
    for x, prob in enumerate(problems):
        roots = [k for k, kind in enumerate(prob.kinds) if kind != "branch" and first.get((x, k), 1) > 0]
        assert sum(credit.advantages[x][k][0] for k in roots) == pytest.approx(0.0, abs=1e-9)


def test_root_credit_is_named():
    with pytest.raises(ValueError, match="root_credit"):
        CBPOConfig(root_credit="centered")
