import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy import stats as sps

from rlcurate.stats import (
    BetaBeliefs,
    beta_entropy,
    expected_variance_reduction,
    insight_score,
    insight_weight,
    mopps_select,
    mutual_information,
    top_m,
)

pos = st.floats(min_value=0.2, max_value=50.0)


def test_beta_entropy_matches_scipy():
    for a, b in [(1, 1), (2, 5), (0.5, 0.5), (30, 3)]:
        assert beta_entropy(a, b) == pytest.approx(sps.beta(a, b).entropy(), abs=1e-10)


@given(pos, pos, st.integers(0, 12))
@settings(max_examples=60, deadline=None)
def test_mi_equals_entropy_difference_of_the_counts(a, b, K):
    """I(R;phi) = H(S) - E_phi H(S | phi) with S ~ betabinom, computed by quadrature."""
    mi = mutual_information(a, b, K)
    assert mi >= 0 and np.isfinite(mi)
    if K == 0:
        assert mi == 0.0
        return
    s = np.arange(K + 1)
    pb = sps.betabinom.pmf(s, K, a, b)
    h_s = -np.sum(pb[pb > 0] * np.log(pb[pb > 0]))

    def cond(phi):
        q = sps.binom.pmf(s, K, phi)
        q = q[q > 0]
        return -np.sum(q * np.log(q)) * sps.beta.pdf(phi, a, b)

    eh = integrate.quad(cond, 0, 1, limit=400, points=[a / (a + b)])[0]
    assert mi == pytest.approx(h_s - eh, abs=2e-4)


def test_mi_grows_with_K_and_shrinks_with_evidence():
    assert mutual_information(1, 1, 8) > mutual_information(1, 1, 1)
    assert mutual_information(10, 10, 8) < mutual_information(2, 2, 8)
    vec = mutual_information(np.array([1.0, 5.0]), np.array([1.0, 5.0]), 4)
    assert vec.shape == (2,)


def test_variance_reduction_formula():
    a, b = 3.0, 5.0
    n = a + b
    m = a / n
    # exact: Var[phi] - E_R Var[phi | R]
    prior_var = a * b / (n**2 * (n + 1))
    post = m * (a + 1) * b / ((n + 1) ** 2 * (n + 2)) + (1 - m) * a * (b + 1) / ((n + 1) ** 2 * (n + 2))
    assert expected_variance_reduction(a, b) == pytest.approx(prior_var - post)
    assert expected_variance_reduction(a, b) == pytest.approx(m * (1 - m) / (n + 1) ** 2)


def test_insight_weight_and_score():
    assert insight_weight(0.0) == 0.0 and insight_weight(1.0) == 0.0
    m = np.linspace(0, 1, 1001)
    assert 0.2 < m[np.argmax(insight_weight(m))] < 0.5  # pulled toward mu = 0.3
    assert insight_score(1, 1, 8) == pytest.approx(insight_weight(0.5) * mutual_information(1, 1, 8))


def test_top_m_and_mopps():
    assert top_m([0.1, 0.9, 0.9, 0.5], 2).tolist() == [1, 2]
    with pytest.raises(ValueError, match="M"):
        top_m([1.0, 2.0], 3)
    rng = np.random.default_rng(0)
    alpha = np.array([100.0, 1.0, 50.0, 1.0])
    beta = np.array([1.0, 100.0, 50.0, 1.0])
    picks = [tuple(sorted(mopps_select(alpha, beta, 1, rng))) for _ in range(200)]
    assert picks.count((2,)) > 100  # the confident 0.5 prompt wins most draws


def test_beta_beliefs_update_discount_and_state():
    b = BetaBeliefs(3, discount=0.5)
    b.update([0, 1], successes=[4, 0], trials=[8, 8])
    assert b.alpha.tolist() == [0.5 + 0.5 + 4, 1.0, 1.0]
    assert b.beta.tolist() == [0.5 + 0.5 + 4, 0.5 + 0.5 + 8, 1.0]
    state = b.state_dict()
    c = BetaBeliefs(3)
    c.load_state_dict(state)
    assert np.allclose(c.mean, b.mean) and c.discount == 0.5
    with pytest.raises(ValueError, match="discount"):
        BetaBeliefs(2, discount=0.0)
    with pytest.raises(ValueError, match="exceed"):
        b.update([0], [5], [4])
    with pytest.raises(ValueError, match="idx"):
        b.update([3], [0], [1])
    with pytest.raises(ValueError, match="state"):
        BetaBeliefs(2).load_state_dict(state)


def test_beliefs_no_discount_is_conjugate_update():
    rng = np.random.default_rng(1)
    b = BetaBeliefs(1)
    total_s = total_k = 0
    for _ in range(20):
        k = 8
        s = int(rng.binomial(k, 0.3))
        b.update([0], [s], [k])
        total_s += s
        total_k += k
    assert b.alpha[0] == 1 + total_s and b.beta[0] == 1 + total_k - total_s
