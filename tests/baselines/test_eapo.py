"""EAPO [APPROX] (arXiv 2604.11056, BASELINES.md section 5): GRPO advantages with the bounded
entropy modulation of CBPO's Eqs. 16-17."""
import numpy as np
import pytest

from baselines.eapo import EAPO, entropy_z
from cbpo.trajectory import Trajectory


def test_entropy_is_standardised_over_the_batch():
    # H = 0..4: mean 2, population std sqrt(2)
    np.testing.assert_allclose(entropy_z(np.arange(5.0), eps=0.0), (np.arange(5.0) - 2) / np.sqrt(2))
    np.testing.assert_array_equal(entropy_z(np.full(6, 0.3)), np.zeros(6))  # constant entropy: GRPO


def test_credit_is_the_bounded_modulation_of_cbpos_eqs_16_17(fake_agent):
    # Issue 24.6: not the +-50% tanh weights. Both rollouts have entropies 0..4 on their model
    # tokens (an observation after token 2); R = 1, 0 gives A = +-0.70711. With alpha = 0.2 and
    # phi = 2, C = clip(Z, -|A|/2, |A|/2): Z = -1.414, -0.707, 0, 0.707, 1.414 becomes
    # -0.35355, -0.35355, 0, 0.35355, 0.35355, and A + 0.2 sign(A) C.
    group = fake_agent(length=5, tools_at=(2,), entropy=float)([Trajectory(prompt_ids=[1]) for _ in range(2)])
    group[0].reward, group[1].reward = 1.0, 0.0
    (a0, m0), (a1, m1) = EAPO(budget=2).credit([group])[0]
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    c = np.array([-0.353553, -0.353553, 0.0, 0.353553, 0.353553])
    np.testing.assert_allclose(a0, a + 0.2 * c, atol=1e-5)
    np.testing.assert_allclose(a1, -a - 0.2 * c, atol=1e-5)  # the negative rollout: high entropy, more blame
    assert m0.all() and m1.all()
    assert np.all(np.abs(a0 - a) <= 0.2 * a / 2 + 1e-12)  # bounded: |change| <= alpha |A| / phi
    np.testing.assert_allclose(EAPO(budget=2, alpha=0.0).credit([group])[0][0][0], a)  # alpha = 0: GRPO


def test_alpha_below_phi_keeps_every_sign():
    with pytest.raises(ValueError, match="alpha"):
        EAPO(alpha=2.0, phi=2.0)
