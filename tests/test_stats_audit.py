import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlcurate.stats import (
    categorize,
    category_counts,
    fit_beta_prior,
    gate_open_prob,
    group_mixed_prob,
    hidden_signal_prob,
    improvement_potential,
    prior_degeneracy,
    recipe_multiplier_rule,
    runs_needed,
    sample_metrics,
    share_interval,
    threshold_side,
    zero_variance_prob,
)

SCORES = [[1, 1, 1], [0, 0, 0, 0], [1, 0, 1], [0.5, 0.5], [0, 0.3, 1]]


def test_sample_metrics_ragged():
    m = sample_metrics(SCORES)
    assert m["n_runs"].tolist() == [3, 4, 3, 2, 3]
    assert m["mean"][2] == pytest.approx(2 / 3)
    assert m["best"].tolist() == [1, 0, 1, 0.5, 1]
    assert m["worst"].tolist() == [1, 0, 0, 0.5, 0]
    assert m["variance"][2] == pytest.approx(np.var([1, 0, 1]))
    assert m["std"][4] == pytest.approx(np.std([0, 0.3, 1]))


def test_categories():
    assert categorize(SCORES).tolist() == ["always_right", "always_wrong", "mixed", "always_wrong", "mixed"]
    assert category_counts(SCORES) == {"always_right": 1, "always_wrong": 2, "mixed": 2}
    assert categorize([[0.5, 0.5]], success=0.5).tolist() == ["always_right"]


def test_improvement_potential():
    out = improvement_potential([[1, 0, 0], [1, 1, 1], [0, 0, 0]])
    assert out["mean"] == pytest.approx(4 / 9)
    assert out["best_of_n"] == pytest.approx(2 / 3)
    assert out["gain"] == pytest.approx(2 / 9)
    assert out["relative_gain"] == pytest.approx(0.5)
    assert improvement_potential([[0, 0]])["relative_gain"] == 0.0


@pytest.mark.parametrize("bad,match", [([], "at least one"), ([[1, 0], []], "row 1"),
                                       ([[1, float("nan")]], "NaN"), (["ab"], "rows")])
def test_bad_score_matrices(bad, match):
    with pytest.raises(ValueError, match=match):
        sample_metrics(bad)


@given(st.floats(0, 1), st.integers(1, 50))
def test_zero_variance_prob(p, n):
    z = zero_variance_prob(p, n)
    assert z == pytest.approx(p**n + (1 - p) ** n)
    assert 2 * 0.5**n - 1e-12 <= z <= 1 + 1e-12


def test_zero_variance_monte_carlo():
    rng = np.random.default_rng(0)
    r = rng.random((100_000, 3)) < 0.2
    same = (r.all(1) | ~r.any(1)).mean()
    assert same == pytest.approx(zero_variance_prob(0.2, 3), abs=0.005)


@given(st.floats(0.01, 0.99), st.sampled_from([0.01, 0.05, 0.2]))
def test_runs_needed_is_minimal(p, miss):
    n = runs_needed(p, miss)
    assert zero_variance_prob(p, n) <= miss
    if n > 1:
        assert zero_variance_prob(p, n - 1) > miss


def test_runs_needed_errors():
    with pytest.raises(ValueError, match="strictly inside"):
        runs_needed(0.0)
    with pytest.raises(ValueError, match="miss"):
        runs_needed(0.5, miss=1.5)
    assert runs_needed(np.array([0.5, 0.1]), 0.05).tolist() == [6, 29]


def test_share_interval():
    out = share_interval(15, 100)
    assert out["share"] == 0.15 and out["low"] < 0.15 < out["high"]
    assert out["mean"] == pytest.approx(16 / 102)
    with pytest.raises(ValueError, match="k"):
        share_interval(101, 100)


def test_fit_beta_prior_recovers_parameters():
    rng = np.random.default_rng(3)
    p = rng.beta(0.6, 1.4, size=4000)
    k = rng.binomial(16, p)
    a, b = fit_beta_prior(k, np.full(k.size, 16))
    assert a == pytest.approx(0.6, rel=0.15) and b == pytest.approx(1.4, rel=0.15)


def test_hidden_signal_prob_matches_monte_carlo():
    rng = np.random.default_rng(4)
    a, b, n, m = 0.5, 1.5, 3, 8
    p = rng.beta(a, b, size=400_000)
    fails = rng.binomial(n, p) == 0
    later = rng.binomial(m, p[fails]) > 0
    assert hidden_signal_prob(n, False, m, (a, b)) == pytest.approx(later.mean(), abs=0.005)
    wins = rng.binomial(n, p) == n
    later_fail = rng.binomial(m, p[wins]) < m
    assert hidden_signal_prob(n, True, m, (a, b)) == pytest.approx(later_fail.mean(), abs=0.01)


def test_recipe_multiplier_rule_thresholds():
    assert recipe_multiplier_rule(0.05)["verdict"] == "warning"
    assert recipe_multiplier_rule(0.12)["multiplier"] == (2, 4)
    assert recipe_multiplier_rule(0.15)["multiplier"] == (1, 2)
    assert recipe_multiplier_rule(0.5)["multiplier"] == (1, 1)
    with pytest.raises(ValueError):
        recipe_multiplier_rule(1.2)


def test_group_mixed_prob_is_unbiased_for_the_gate():
    """E over k ~ Binomial(n, p) of 1 - [C(k,G) + C(n-k,G)] / C(n,G) is u(p, G), exactly."""
    from scipy import stats

    n = 8
    for p in (0.03, 0.2, 0.5, 0.9):
        k = np.arange(n + 1)
        rows = [[1] * j + [0] * (n - j) for j in k]
        for G in (1, 2, 3, 5, 8):
            est = group_mixed_prob(rows, G)
            assert np.dot(stats.binom.pmf(k, n, p), est) == pytest.approx(gate_open_prob(p, G), abs=1e-12)
    assert group_mixed_prob([[0, 1, 1, 0], [1, 1, 1, 1]], 4).tolist() == [1.0, 0.0]
    # graded scores: three distinct values, any 2 of them differ unless both are the repeated one
    assert group_mixed_prob([[0.5, 0.5, 0.2, 1.0]], 2)[0] == pytest.approx(1 - 1 / 6)
    with pytest.raises(ValueError, match="exceeds the 2 runs"):
        group_mixed_prob([[0, 1], [1, 1, 0]], 3)


def test_threshold_side():
    assert threshold_side(0.02, 0.08, 0.10) == "below"
    assert threshold_side(0.10, 0.30, 0.10) == "above"
    assert threshold_side(0.294, 0.529, 0.30) == "straddles"  # "over 30% mixed" with this interval cannot be said
    with pytest.raises(ValueError, match="low must not exceed high"):
        threshold_side(0.5, 0.4, 0.3)


def test_prior_degeneracy_flags_runaway_fits():
    rng = np.random.default_rng(0)
    polar = np.array([0, 0, 4, 4, 0, 4])             # every prompt right or wrong on all runs: a, b -> 0
    alike = rng.binomial(4, 0.25, size=80)           # one pass rate for all: a + b -> infinity
    spread = rng.binomial(8, rng.beta(0.5, 0.8, size=200))
    for k, n, bad in ((polar, 4, "pile up at 0 and 1"), (alike, 4, "all prompts alike"), (spread, 8, None)):
        a, b = fit_beta_prior(k, np.full(k.size, n))
        why = prior_degeneracy(a, b)
        assert (why is None) if bad is None else (bad in why), (a, b, why)
