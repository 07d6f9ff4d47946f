"""rlcurate.analysis: learning curves at equal compute and rollouts-to-target (chapter 10)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.analysis import (Curve, compare_to_baseline, eval_curve, final_accuracy, first_crossing,
                               mean_curve, smooth)


def fake_run(xs, ys, name="r", seed=0):
    metrics = [{"step": 0, "eval/accuracy": ys[0]}]
    for i, (x, y) in enumerate(zip(xs[1:], ys[1:]), start=1):
        metrics.append({"step": 10 * i, "eval/accuracy": y, "total/rollouts": x, "time/total_generate": x / 100,
                        "time/total_train": x / 200, "total/generated_tokens": 30 * x,
                        "total/trained_tokens": 10 * x})
        metrics.append({"step": 10 * i + 1, "total/rollouts": x + 1})  # a step without evaluation
    return {"run": name, "seed": seed, "metrics": metrics}


def test_eval_curve_reads_evaluated_steps_on_each_axis():
    run = fake_run([0, 100, 200], [0.1, 0.2, 0.3])
    c = eval_curve(run)
    assert np.array_equal(c.x, [0, 100, 200]) and np.array_equal(c.y, [0.1, 0.2, 0.3])
    assert np.allclose(eval_curve(run, "seconds").x, [0, 1.5, 3.0])
    assert np.allclose(eval_curve(run, "tokens").x, [0, 4000, 8000])


def test_eval_curve_errors_name_the_problem():
    with pytest.raises(ValueError, match="axis"):
        eval_curve(fake_run([0, 1], [0, 1]), axis="steps")
    with pytest.raises(ValueError, match="no metrics"):
        eval_curve({"run": "x", "seed": 0, "metrics": []})
    with pytest.raises(ValueError, match="fewer than two"):
        eval_curve({"run": "x", "seed": 0, "metrics": [{"step": 0, "eval/accuracy": 0.3}]})
    bad = {"run": "x", "seed": 1, "metrics": [{"step": 0, "eval/accuracy": 0.3}, {"step": 5, "eval/accuracy": 0.4}]}
    with pytest.raises(ValueError, match="total/rollouts"):
        eval_curve(bad)


def test_first_crossing_interpolates_linearly():
    x = np.array([0.0, 10.0, 20.0])
    y = np.array([0.0, 1.0, 2.0])
    assert first_crossing(x, y, 0.5) == pytest.approx(5.0)
    assert first_crossing(x, y, 0.0) == 0.0
    assert math.isnan(first_crossing(x, y, 2.5))
    # the first crossing, not a later one
    assert first_crossing([0, 1, 2, 3], [0, 1, 0, 1], 1.0) == 1.0


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=30), st.sampled_from([1, 3, 5]))
@settings(max_examples=60, deadline=None)
def test_smooth_keeps_constants_and_bounds(values, window):
    y = np.array(values)
    s = smooth(y, window)
    assert s.shape == y.shape
    assert np.all(s >= y.min() - 1e-12) and np.all(s <= y.max() + 1e-12)
    assert np.allclose(smooth(np.full(len(values), 0.7), window), 0.7)
    if window == 1:
        assert np.array_equal(s, y)


def test_smooth_rejects_even_window():
    with pytest.raises(ValueError, match="odd"):
        smooth([1.0, 2.0], 2)


def test_mean_curve_ignores_seeds_past_their_end():
    grid = np.linspace(0, 20, 5)
    a = Curve(np.array([0.0, 10.0, 20.0]), np.array([0.0, 0.0, 0.0]))
    b = Curve(np.array([0.0, 10.0]), np.array([1.0, 1.0]))
    m = mean_curve([a, b], grid, window=1)
    assert np.allclose(m[:3], 0.5) and np.allclose(m[3:], 0.0)


def saturating(x, rate):
    return 0.4 + 0.3 * (1 - np.exp(-rate * x))


def test_compare_to_baseline_recovers_a_known_speed_up():
    x = np.linspace(0, 25_600, 161)  # finely evaluated: interpolation and smoothing errors are small
    rng = np.random.default_rng(0)
    curves = {
        "uniform": [Curve(x, saturating(x, 1e-4) + rng.normal(0, 1e-4, x.size)) for _ in range(3)],
        "twice_as_fast": [Curve(x, saturating(x, 2e-4)) for _ in range(3)],
        "twice_as_slow": [Curve(x, saturating(x, 0.5e-4)) for _ in range(3)],
    }
    table = compare_to_baseline(curves, budget=25_600, gain_fraction=0.6, n_boot=300, grid_points=2001)
    assert table["uniform"]["ratio"] == 1.0
    assert table["twice_as_fast"]["ratio"] == pytest.approx(0.5, rel=0.02)
    assert table["twice_as_slow"]["ratio"] == pytest.approx(2.0, rel=0.02)
    for row in table.values():
        assert row["ratio_lo"] <= row["ratio"] <= row["ratio_hi"] or math.isinf(row["ratio_hi"])
    # the full target: the slower strategy never reaches the baseline's final accuracy
    full = compare_to_baseline(curves, budget=25_600, n_boot=300)
    assert math.isinf(full["twice_as_slow"]["ratio"]) and full["twice_as_slow"]["reached_share"] == 0.0
    assert full["twice_as_fast"]["ratio"] < 1 and full["twice_as_fast"]["diff"] > 0
    assert full["uniform"]["target"] == pytest.approx(np.mean([final_accuracy(c) for c in curves["uniform"]]))


def test_compare_to_baseline_bad_input():
    c = [Curve(np.array([0.0, 1.0]), np.array([0.1, 0.2]))]
    with pytest.raises(ValueError, match="baseline 'uniform'"):
        compare_to_baseline({"other": c})
    with pytest.raises(ValueError, match="'empty' has no runs"):
        compare_to_baseline({"uniform": c, "empty": []})
    with pytest.raises(ValueError, match="gain_fraction"):
        compare_to_baseline({"uniform": c}, gain_fraction=0.0)
    with pytest.raises(ValueError, match="level"):
        compare_to_baseline({"uniform": c}, level=1.5)
