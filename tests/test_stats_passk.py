import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlcurate.stats import pass_at_k, pass_at_k_curve, pass_at_k_exact


@st.composite
def nck(draw):
    n = draw(st.integers(min_value=1, max_value=60))
    c = draw(st.integers(min_value=0, max_value=n))
    k = draw(st.integers(min_value=1, max_value=n))
    return n, c, k


@given(nck())
def test_pass_at_k_matches_closed_form(args):
    n, c, k = args
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= pass_at_k(n, c, k) <= 1.0


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10_000, 1, 5000) == pytest.approx(0.5)  # no overflow


def test_pass_at_k_is_unbiased():
    rng = np.random.default_rng(1)
    p, n, k = 0.1, 20, 5
    c = rng.binomial(n, p, size=100_000)
    est = np.mean([pass_at_k(n, ci, k) for ci in c[:20_000]])
    assert est == pytest.approx(pass_at_k_exact(p, k), abs=0.01)


@pytest.mark.parametrize("args", [(0, 0, 1), (5, 6, 1), (5, 2, 0), (5, 2, 6), (5.5, 2, 1)])
def test_pass_at_k_rejects(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_curve_ragged_and_errors():
    scores = [[1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1]]
    out = pass_at_k_curve(scores)
    assert out["k"].tolist() == [1, 2, 4]
    assert out["pass_at_k"][0] == pytest.approx((0.25 + 0 + 1) / 3)
    assert out["pass_at_k"][-1] == pytest.approx((1 + 0 + 1) / 3)
    with pytest.raises(ValueError, match="fewest runs"):
        pass_at_k_curve(scores, ks=[8])
    with pytest.raises(ValueError, match="row 1"):
        pass_at_k_curve([[1], []])
    with pytest.raises(ValueError):
        pass_at_k_curve([])


def test_exact_edges():
    assert pass_at_k_exact(0.0, 3) == 0.0
    assert pass_at_k_exact(1.0, 3) == 1.0
    assert pass_at_k_exact(np.array([0.5]), 2)[0] == pytest.approx(0.75)
