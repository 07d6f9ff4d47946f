"""rlcurate.analysis: learning curves at equal compute and rollouts-to-target (chapter 10)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.analysis import (Curve, at_budget, bootstrap_mean, compare_to_baseline, curves_by_run, curves_on_grid,
                               eval_curve, final_accuracy, first_crossing, mean_curve, smooth)


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
        eval_curve(fake_run([0, 1], [0, 1]), axis="epochs")
    with pytest.raises(ValueError, match="no metrics"):
        eval_curve({"run": "x", "seed": 0, "metrics": []})
    with pytest.raises(ValueError, match="fewer than two"):
        eval_curve({"run": "x", "seed": 0, "metrics": [{"step": 0, "eval/accuracy": 0.3}]})
    bad = {"run": "x", "seed": 1, "metrics": [{"step": 0, "eval/accuracy": 0.3}, {"step": 5, "eval/accuracy": 0.4}]}
    with pytest.raises(ValueError, match="total/rollouts"):
        eval_curve(bad)


def test_eval_curve_on_steps_on_records_and_on_any_key():
    run = fake_run([0, 100, 200], [0.1, 0.2, 0.3])
    assert np.array_equal(eval_curve(run, "steps").x, [0, 10, 20])
    # a run's metric records themselves (metrics.jsonl) give the same curve
    c = eval_curve(run["metrics"])
    assert np.array_equal(c.x, [0, 100, 200]) and np.array_equal(c.y, [0.1, 0.2, 0.3])
    # a per-step metric: every step that logged it, at its cumulative rollouts
    steps = [{"step": 0, "eval/accuracy": 0.1}] + [{"step": i, "total/rollouts": 128 * i, "mixed": i / 10}
                                                     for i in range(1, 4)]
    m = eval_curve(steps, key="mixed")
    assert np.array_equal(m.x, [128, 256, 384]) and np.allclose(m.y, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="metric records has no metrics"):
        eval_curve([])


def test_curve_upto_cuts_at_a_budget():
    c = Curve(np.array([0.0, 10.0, 20.0, 30.0]), np.array([1.0, 2.0, 3.0, 4.0])).upto(20)
    assert np.array_equal(c.x, [0, 10, 20]) and np.array_equal(c.y, [1, 2, 3])


def test_curves_by_run_groups_in_the_given_order():
    results = [fake_run([0, 1], [0.1, 0.2], "b", 0), fake_run([0, 1], [0.3, 0.4], "a", 0),
               fake_run([0, 1], [0.5, 0.6], "b", 1)]
    by = curves_by_run(results)
    assert list(by) == ["b", "a"] and [c.y[0] for c in by["b"]] == [0.1, 0.5]
    by = curves_by_run(results, ["a", "missing", "b"], axis="steps")
    assert list(by) == ["a", "b"] and np.array_equal(by["a"][0].x, [0, 10])


def test_curves_on_grid_rows_and_their_mean():
    grid = np.linspace(0, 20, 5)
    a = Curve(np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 2.0]))
    b = Curve(np.array([0.0, 10.0]), np.array([1.0, 1.0]))
    rows = curves_on_grid([a, b], grid, window=1)
    assert rows.shape == (2, 5)
    assert np.allclose(rows[0], [0, 0.5, 1, 1.5, 2]) and np.isnan(rows[1, 3:]).all()
    assert np.allclose(mean_curve([a, b], grid, window=1), np.nanmean(rows, axis=0))
    assert curves_on_grid([], grid).shape == (0, 5) and np.isnan(mean_curve([], grid)).all()


def test_at_budget_reads_the_first_record_at_the_budget():
    recs = [{"step": 0, "held_out": 0.1}, {"step": 1, "total_rollouts": 128, "held_out": 0.2},
            {"step": 2, "total_rollouts": 256, "held_out": 0.3}]
    assert at_budget(recs, 200) == 0.3 and at_budget(recs, 1, key="step") == 0.2
    assert at_budget(recs, 0) == 0.1  # a record without the key counts as 0
    with pytest.raises(ValueError, match="no record reaches"):
        at_budget(recs, 1000)


def test_bootstrap_mean_interval():
    x = np.random.default_rng(3).normal(0.5, 1.0, 400)
    m, lo, hi = bootstrap_mean(x, n_boot=2000, seed=11)
    assert m == pytest.approx(x.mean()) and lo < m < hi
    assert hi - lo == pytest.approx(2 * 1.96 / np.sqrt(400), rel=0.15)  # about the normal interval
    assert bootstrap_mean(x, seed=11) == bootstrap_mean(x, seed=11)     # reproducible
    assert bootstrap_mean([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3, 0.3))
    with pytest.raises(ValueError, match="no values"):
        bootstrap_mean([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_mean(x, level=1.0)


def test_compare_to_baseline_baseline_is_one_even_when_it_peaks_early():
    # a baseline whose curve reaches its final value before the end (noisy evaluations) still has ratio 1:
    # the ratio is its own cost over itself, never the budget over its cost
    x = np.linspace(0, 1000, 11)
    y = np.array([0.2, 0.4, 0.6, 0.7, 0.72, 0.7, 0.69, 0.71, 0.7, 0.7, 0.7])
    curves = {"uniform": [Curve(x, y), Curve(x, y + 0.01)], "other": [Curve(x, y + 0.02)]}
    table = compare_to_baseline(curves, budget=1000, n_boot=50, window=1, last=1)
    assert table["uniform"]["ratio"] == 1.0 and table["uniform"]["cost"] < 1000
    assert table["uniform"]["final"] == pytest.approx(0.705) and table["other"]["diff"] == pytest.approx(0.015)
    # last = 3 averages the last three evaluations of each seed
    assert compare_to_baseline(curves, budget=1000, n_boot=50)["uniform"]["final"] == pytest.approx(0.705)
    assert compare_to_baseline({"uniform": [Curve(x, np.r_[y[:-1], 1.0])]}, budget=1000, n_boot=5,
                               last=3)["uniform"]["final"] == pytest.approx(0.8)


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


def test_compare_to_baseline_baseline_reaches_its_own_final_point():
    # with last = window = 1 the target is the mean of the seeds' final points, the end of the mean curve;
    # rounding must not leave the baseline short of its own target
    x = np.linspace(0, 1000, 11)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        curves = {"uniform": [Curve(x, np.sort(rng.random(11))) for _ in range(9)]}
        t = compare_to_baseline(curves, budget=1000, window=1, last=1, n_boot=20, grid_points=11)["uniform"]
        assert t["ratio"] == 1.0 and t["cost"] == pytest.approx(1000)
