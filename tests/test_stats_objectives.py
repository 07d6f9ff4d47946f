import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlcurate.stats import OBJECTIVES, clip_pass_rate, get_objective, grpo_effective_weight, smooth_pass_rate
from rlcurate.stats.advantages import standardised
from rlcurate.stats.objectives import effective_weight

probs = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@given(p=probs)
def test_every_objective_is_finite_on_the_closed_interval(name, p):
    obj = get_objective(name)
    assert np.isfinite(obj.f(p)) and np.isfinite(obj.weight(p)) and np.isfinite(obj.allocation_profile(p))
    assert obj.weight(p) > 0


@pytest.mark.parametrize("name,kw", [("linear", {}), ("log", {}), ("power", {"alpha": 0.5}),
                                     ("power", {"alpha": 2.0}), ("arcsin", {})])
def test_weight_is_the_derivative(name, kw):
    obj = get_objective(name, **kw)
    p = np.linspace(0.05, 0.95, 19)
    h = 1e-6
    numeric = (obj.f(p + h) - obj.f(p - h)) / (2 * h)
    assert np.allclose(obj.weight(p), numeric, rtol=1e-5)


def test_known_weights():
    p = np.array([0.1, 0.5, 0.8])
    assert np.allclose(get_objective("log").weight(p), 1 / p)
    assert np.allclose(get_objective("arcsin").weight(p), 1 / np.sqrt(p * (1 - p)))
    assert np.allclose(get_objective("power", alpha=0.5).weight(p), 0.5 / np.sqrt(p))
    assert np.allclose(get_objective("arcsin").f(p), 2 * np.arcsin(np.sqrt(p)))
    # the arcsin allocation profile is flat: uniform allocation is optimal for GRPO
    assert np.allclose(get_objective("arcsin").allocation_profile(p), 1.0)


def test_clip_and_smoothing():
    assert get_objective("log", delta=0.01).weight(0.0) == pytest.approx(100.0)
    assert clip_pass_rate(1.0, 0.05) == pytest.approx(0.95)
    assert smooth_pass_rate(0, 8) == pytest.approx(0.1)
    assert np.allclose(smooth_pass_rate([0, 8], [8, 8], 1, 16), [1 / 25, 9 / 25])
    obj = get_objective("log")
    assert obj.weight_from_counts(0, 4) == pytest.approx(6.0)


@pytest.mark.parametrize("call,match", [
    (lambda: get_objective("cubic"), "objective"),
    (lambda: get_objective("power", alpha=-1), "alpha"),
    (lambda: get_objective("log", alpha=2), "no parameters"),
    (lambda: get_objective("log", delta=0.7), "delta"),
    (lambda: get_objective("log").weight(1.2), "p"),
    (lambda: get_objective("log").f(float("nan")), "NaN"),
    (lambda: smooth_pass_rate(5, 3), "exceed"),
    (lambda: smooth_pass_rate(1, 3, alpha=0), "alpha"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_grpo_weight_limits_and_monte_carlo():
    p = np.array([0.1, 0.3, 0.5])
    big = grpo_effective_weight(p, 2000, eps=0.0)
    assert np.allclose(big, 1 / np.sqrt(p * (1 - p)), rtol=0.01)
    # at finite G the weight saturates instead of diverging: (G - 1)/sqrt(G) with Bessel's std (the
    # default, as verl and advantages.standardised), sqrt(G - 1) with the population std
    assert grpo_effective_weight(0.0, 8, eps=0.0) == pytest.approx(7 / np.sqrt(8))
    assert grpo_effective_weight(1.0, 8, eps=0.0, ddof=0) == pytest.approx(np.sqrt(7))
    assert grpo_effective_weight(0.0, 8, eps=0.0, ddof=0) == pytest.approx(np.sqrt(7))
    assert grpo_effective_weight(0.3, 2) == pytest.approx(effective_weight(0.3, 2, standardised))
    assert grpo_effective_weight(0.4, 1) == 0.0
    # Monte Carlo of E[A | r=1] - E[A | r=0] for G = 4
    rng = np.random.default_rng(0)
    G, q = 4, 0.3
    r = (rng.random((400_000, G)) < q).astype(float)
    s = r.std(axis=1, keepdims=True)
    a = np.where(s > 0, (r - r.mean(axis=1, keepdims=True)) / (s + 1e-6), 0.0)
    mc = a[r == 1].mean() - a[r == 0].mean()
    assert mc == pytest.approx(grpo_effective_weight(q, G, ddof=0), abs=0.01)
