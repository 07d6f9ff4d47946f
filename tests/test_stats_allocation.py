import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.stats import (
    allocation_variance,
    continuous_allocation,
    cross_fitted_allocation_ratio,
    escalation_cost,
    escalation_cost_from_coverage,
    gvm_allocation,
    optimal_allocation,
    plug_in_allocation_ratio,
    round_preserving_sum,
    variance_coefficients,
)


@st.composite
def allocation_problem(draw):
    B = draw(st.integers(1, 4))
    p = draw(st.lists(st.floats(0, 1), min_size=B, max_size=B))
    n_min = draw(st.integers(0, 2))
    n_max = draw(st.integers(max(n_min, 1), 6))
    budget = draw(st.integers(B * n_min, B * n_max))
    obj = draw(st.sampled_from(["linear", "log", "arcsin", "power"]))
    return np.array(p), budget, obj, n_min, n_max


@given(allocation_problem())
@settings(max_examples=150, deadline=None)
def test_optimal_allocation_is_exact_integer_optimum(problem):
    p, budget, obj, n_min, n_max = problem
    n = optimal_allocation(p, budget, obj, n_min=n_min, n_max=n_max)
    assert n.sum() == budget and n.min() >= n_min and n.max() <= n_max
    c = variance_coefficients(p, obj)
    feasible = [m for m in itertools.product(range(n_min, n_max + 1), repeat=p.size)
                if sum(m) == budget and all(mi > 0 or ci == 0 for mi, ci in zip(m, c))]
    if feasible:
        best = min(allocation_variance(c, np.array(m)) for m in feasible)
        assert allocation_variance(c, n) == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_uniform_for_grpo_and_shapes_for_others():
    p = np.array([0.05, 0.2, 0.5, 0.8, 0.95])
    assert optimal_allocation(p, 40, "arcsin").tolist() == [8] * 5
    assert optimal_allocation([0.5] * 4, 10, "arcsin").tolist() == [3, 3, 2, 2]
    log = optimal_allocation(p, 400, "log")
    assert np.all(np.diff(log) < 0)  # harder prompts get more
    lin = optimal_allocation(p, 400, "linear")
    assert lin.argmax() == 2  # p = 1/2 is the noisiest under the linear objective


def test_proportional_to_lagrange_solution_for_large_budgets():
    p = np.array([0.1, 0.3, 0.6])
    n = optimal_allocation(p, 30_000, "log", n_min=0)
    target = np.sqrt((1 - p) / p)
    assert np.allclose(n / n.sum(), target / target.sum(), atol=1e-3)


def test_bounds_errors_name_the_problem():
    with pytest.raises(ValueError, match="below n_min"):
        optimal_allocation([0.5, 0.5], 3, n_min=2)
    with pytest.raises(ValueError, match="exceeds n_max"):
        optimal_allocation([0.5, 0.5], 30, n_max=4)
    with pytest.raises(ValueError, match="budget"):
        optimal_allocation([0.5], -1)
    with pytest.raises(ValueError, match="n_max"):
        optimal_allocation([0.5], 4, n_min=3, n_max=2)
    with pytest.raises(ValueError, match="p"):
        optimal_allocation([0.5, float("nan")], 4)


def test_continuous_allocation_respects_bounds():
    c = np.array([1.0, 100.0, 0.0, 4.0])
    n = continuous_allocation(c, 40, n_min=1, n_max=20)
    assert n.sum() == pytest.approx(40) and n.min() >= 1 - 1e-9 and n.max() <= 20 + 1e-9


def test_round_preserving_sum():
    assert round_preserving_sum([0.5, 0.5, 1.0], 2).sum() == 2
    assert round_preserving_sum([1.2, 2.7, 3.1]).tolist() == [1, 3, 3]


def test_gvm_allocation():
    n = gvm_allocation([0.0, 0.1, 0.5, 0.9], [1.0, 1.0, 1.0, 0.0], 100)
    assert n.sum() == 100 and n[0] == 0 and n[3] == 0 and n[1] > n[2]
    s = 1 / np.sqrt(np.array([0.1, 0.5]) + 1e-3 / np.array([0.1, 0.5]))
    assert n[1] / n[2] == pytest.approx(s[0] / s[1], rel=0.05)
    with pytest.raises(ValueError, match="p > 0"):
        gvm_allocation([0.0], [1.0], 10)


def test_escalation_cost_recomputes_a_worked_example():
    out = escalation_cost_from_coverage([0.627, 0.796, 0.813], (4, 32, 256))
    assert out["expected_cost"] == pytest.approx(4 + 0.373 * 28 + 0.204 * 224)
    assert out["never_solved"] == pytest.approx(0.187)
    assert np.allclose(out["first_solved_at_tier"], [0.627, 0.169, 0.017])


def test_escalation_afresh_reaches_a_tier_only_after_every_earlier_tier_failed():
    """Without reuse a prompt reaches the 256 tier after 4 + 32 = 36 failures, not 32."""
    p = 0.02
    fresh = escalation_cost([p], (4, 32, 256), reuse=False)
    assert fresh["expected_cost"] == pytest.approx(4 + (1 - p) ** 4 * 32 + (1 - p) ** 36 * 256)
    assert fresh["never_solved"] == pytest.approx((1 - p) ** 292)
    reused = escalation_cost([p], (4, 32, 256))
    assert reused["expected_cost"] == pytest.approx(4 + (1 - p) ** 4 * 28 + (1 - p) ** 32 * 224)
    # the shortcut that reads the reused schedule's coverage for the afresh one overstates the cost
    assert fresh["expected_cost"] < 4 + (1 - p) ** 4 * 32 + (1 - p) ** 32 * 256


def test_escalation_cost_from_pass_rates_monte_carlo():
    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 2.0, size=2000)
    out = escalation_cost(p, (4, 32, 256))
    costs = []
    for q in p[:2000]:
        draws = rng.random(256) < q
        if draws[:4].any():
            costs.append(4)
        elif draws[:32].any():
            costs.append(32)
        else:
            costs.append(256)
    assert np.mean(costs) == pytest.approx(out["expected_cost"], rel=0.08)
    afresh = []
    for q in p:
        draws = rng.random(292) < q            # tiers of 4, then 32 new, then 256 new rollouts
        afresh.append(4 if draws[:4].any() else 36 if draws[:36].any() else 292)
    assert np.mean(afresh) == pytest.approx(escalation_cost(p, (4, 32, 256), reuse=False)["expected_cost"], rel=0.08)
    with pytest.raises(ValueError, match="increasing"):
        escalation_cost(p, (4, 4))


def test_denormal_pass_rates_still_get_their_first_rollout():
    """Regression: a prompt with a tiny but positive c must not be left at 0 rollouts (infinite variance)."""
    p = np.array([3.17e-295, 0.98, 5.0e-234, 7.2e-137])
    n = optimal_allocation(p, 4, "linear", n_min=0, n_max=5)
    assert n.tolist() == [1, 1, 1, 1]


def test_allocations_refuse_a_batch_that_is_not_one_pass_rate_per_prompt_and_absurd_budgets():
    """Issue #30: a 2-D p used to reach numpy's "truth value is ambiguous", and budget=10**18 with prompts
    at p = 0 or 1 looped for ever handing out zero-gain rollouts one at a time."""
    from rlcurate.stats import gvm_allocation, optimal_allocation

    with pytest.raises(ValueError, match=r"one pass rate per prompt \(a 1-D array\), got an array of shape \(2, 2\)"):
        optimal_allocation(np.array([[0.1, 0.5], [0.2, 0.3]]), 8)
    with pytest.raises(ValueError, match=r"one pass rate per prompt"):
        gvm_allocation(np.array([[0.1, 0.5]]), np.ones((1, 2)), 8)
    with pytest.raises(ValueError, match=r"budget must be <= 2147483648"):
        optimal_allocation([0.1, 0.5], 10**18)
    # zero-gain prompts share what is left round-robin, at once even for the largest budget
    assert optimal_allocation([0.0, 0.0, 1.0], 10).tolist() == [4, 3, 3]
    assert optimal_allocation([0.0, 1.0, 0.5], 2**31).tolist() == [1, 1, 2**31 - 2]


def test_cross_fitted_allocation_ratio_by_hand():
    # two prompts, one step of 2 x 8 = 16 rollouts; runs 0-1 allocate, runs 2-3 are held out (both pairs disagree,
    # so each prompt's p (1 - p) is estimated as 1/2). Prompt 0's allocation runs both failed: the plug-in gives
    # it n_min = 2 and prompt 1 (k = 1 of 2) the other 14.
    scores = np.array([[0, 0, 1, 0], [1, 0, 0, 1]])
    plug = cross_fitted_allocation_ratio(scores, 2, False, batch=2, per_prompt=8, held_out=[(2, 3)])
    assert plug["ratio"] == pytest.approx((0.5 / 2 + 0.5 / 14) / (0.5 / 8 + 0.5 / 8))
    assert plug["agreed"] == pytest.approx(4.0) and plug["others"] == pytest.approx(8 / 14)
    assert plug["low"] <= plug["ratio"] <= plug["high"]
    # smoothed, prompt 0 reads (0 + 1) / (2 + 2) = 1/4 and prompt 1 2/4
    n = optimal_allocation([0.25, 0.5], 16, "linear", n_min=2)
    assert n.tolist() != [2, 14]
    smooth = cross_fitted_allocation_ratio(scores, 2, True, batch=2, per_prompt=8, held_out=[(2, 3)])
    assert smooth["ratio"] == pytest.approx((0.5 / n[0] + 0.5 / n[1]) / (0.5 / 8 + 0.5 / 8))


def test_cross_fitted_allocation_ratio_is_one_when_the_rule_is_uniform():
    # every prompt's runs read the same, so the rule splits each step evenly: the ratio is exactly 1
    scores = np.tile([1, 0, 1, 0, 0, 1, 1, 0], (64, 1))
    r = cross_fitted_allocation_ratio(scores, 6, False, passes=2)
    assert r["ratio"] == pytest.approx(1.0) and np.isnan(r["agreed"]) and r["others"] == pytest.approx(1.0)


def test_cross_fitted_allocation_ratio_refuses_bad_input():
    scores = np.tile([1, 0, 1, 0, 0, 1, 1, 0], (32, 1))
    for args, kwargs, message in [
            ((np.full((4, 8), 0.5), 6, False), {}, "0 and 1"),
            ((scores, 7, False), {}, "alloc_runs"), ((scores, 2.5, False), {}, "alloc_runs"),
            ((scores, 6, False), {"held_out": [(0, 0)]}, "held_out"), ((scores, 6, False), {"held_out": []}, "held_out"),
            ((scores, 6, False), {"held_out": [(0, 9)]}, "held_out"),
            ((scores, 6, False), {"batch": 64}, "batch"), ((scores, 6, False), {"batch": 0}, "batch"),
            ((scores, 6, False), {"passes": 0}, "passes"), ((np.zeros((32, 8)), 6, False), {}, "no held-out pair")]:
        with pytest.raises(ValueError, match=message):
            cross_fitted_allocation_ratio(*args, **kwargs)


def test_plug_in_allocation_ratio_by_hand():
    # prompt 0's two runs both failed: the plug-in gives it n_min = 2, prompt 1 (one success) the other 14;
    # scored with the exact p (1 - p) of p = 0.1 and 0.5
    scores = np.array([[0, 0], [1, 0]])
    expected = (0.09 / 2 + 0.25 / 14) / ((0.09 + 0.25) / 8)
    assert plug_in_allocation_ratio([0.1, 0.5], scores, batch=2, per_prompt=8) == pytest.approx(expected)
    n = optimal_allocation([0.25, 0.5], 16, "linear", n_min=2)  # smoothed: 1/4 and 2/4
    smoothed = plug_in_allocation_ratio([0.1, 0.5], scores, smoothed=True, batch=2, per_prompt=8)
    assert smoothed == pytest.approx((0.09 / n[0] + 0.25 / n[1]) / ((0.09 + 0.25) / 8)) and smoothed < expected
    with pytest.raises(ValueError, match="one row per pass rate"):
        plug_in_allocation_ratio([0.1, 0.5, 0.2], scores)
    with pytest.raises(ValueError, match="pass_rates"):
        plug_in_allocation_ratio([0.1, 1.5], scores, batch=2)
    with pytest.raises(ValueError, match="0 and 1"):
        plug_in_allocation_ratio([0.1, 0.5], [[0.5, 0], [1, 0]], batch=2)
    with pytest.raises(ValueError, match="no variance"):
        plug_in_allocation_ratio([0.0, 1.0], scores, batch=2)
