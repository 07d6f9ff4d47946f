"""Comparing training runs at equal compute (chapters 5 to 10; the method is chapter 10's, *End to end*).

A reference run (``rlcurate runs``, :mod:`rlcurate.experiments`) stores one metrics record per step;
some records carry a held-out evaluation. This module turns runs into learning curves on a common
compute axis and answers the book's question: how many rollouts does a strategy need to reach the
baseline's final accuracy, relative to the baseline, with a bootstrap confidence interval over seeds.

    curves = curves_by_run(load_results("data/runs/end_to_end"))   # {run name: [Curve per seed]}
    table = compare_to_baseline(curves, baseline="uniform", budget=25_600)

Every chapter that draws or compares learning curves calls these functions; none keeps a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from rlcurate._validate import as_int
from rlcurate.comparison import CURRENCY_KEYS
from rlcurate.comparison import first_crossing  # noqa: F401 (chapter 6 reads it from here)

#: Compute axes of :func:`eval_curve`: cumulative generated rollouts, model token passes (generated +
#: trained tokens) and optimizer steps, summed as :data:`rlcurate.comparison.CURRENCY_KEYS` sums them,
#: and wall seconds spent generating and training (evaluation excluded).
AXES = {
    "rollouts": CURRENCY_KEYS["rollouts"],
    "seconds": ("time/total_generate", "time/total_train"),
    "tokens": CURRENCY_KEYS["tokens"],
    "steps": CURRENCY_KEYS["steps"],
}


@dataclass(frozen=True)
class Curve:
    """Held-out accuracy ``y`` at cumulative compute ``x`` (increasing, starting at 0)."""

    x: np.ndarray
    y: np.ndarray

    def upto(self, x_max: float) -> "Curve":
        """The points at ``x <= x_max``: a run cut at a compute budget."""
        keep = self.x <= x_max
        return Curve(self.x[keep], self.y[keep])


def eval_curve(result: Mapping[str, Any] | Sequence[Mapping[str, Any]], axis: str = "rollouts",
               key: str = "eval/accuracy") -> Curve:
    """The held-out curve of one run: ``key`` at every step that logged it, against the cumulative
    compute ``axis`` (one of :data:`AXES`; ``"steps"`` is the optimizer step). The step-0 record (the
    evaluation before training) sits at x = 0.

    ``result`` is a reference run (``{"run", "seed", "metrics": [...]}``, :mod:`rlcurate.experiments`)
    or a run's list of metric records itself (its ``metrics.jsonl``, one dict a line). ``key`` may be any
    logged metric: ``"eval/all_wrong"``, or a per-step one such as ``"effective_prompt_ratio"`` (every
    training step logs it, so its curve has one point per step)."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {sorted(AXES)}, got {axis!r}")
    if isinstance(result, Mapping):
        metrics, what = result.get("metrics"), f"run {result.get('run')!r} seed {result.get('seed')!r}"
    else:
        metrics, what = list(result), "the metric records"
    if not isinstance(metrics, list) or not metrics:
        raise ValueError(f"{what} has no metrics list")
    xs, ys = [], []
    for m in metrics:
        if key not in m:
            continue
        if m.get("step", 0) == 0:
            x = 0.0
        else:
            missing = [k for k in AXES[axis] if k not in m]
            if missing:
                raise ValueError(f"{what} step {m.get('step')}: no {missing} in its metrics")
            x = float(sum(m[k] for k in AXES[axis]))
        xs.append(x)
        ys.append(float(m[key]))
    if len(xs) < 2:
        raise ValueError(f"{what} has fewer than two evaluations of {key!r}")
    order = np.argsort(xs, kind="stable")
    return Curve(np.asarray(xs)[order], np.asarray(ys)[order])


def curves_by_run(results: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None,
                  axis: str = "rollouts", key: str = "eval/accuracy") -> dict[str, list[Curve]]:
    """Reference runs grouped by run name, one :func:`eval_curve` per seed (in the order of
    ``results``; :func:`rlcurate.experiments.load_results` sorts by seed). ``names`` picks the runs and
    their order (the order matters to :func:`compare_to_baseline`'s bootstrap: pass a suite's run
    order to reproduce another chapter's intervals); names without a run are left out. Without
    ``names``: every run name, in order of first appearance."""
    order = list(names) if names is not None else list(dict.fromkeys(r["run"] for r in results))
    out = {name: [eval_curve(r, axis, key) for r in results if r["run"] == name] for name in order}
    return {name: cs for name, cs in out.items() if cs}


def smooth(y: Sequence[float], window: int = 3) -> np.ndarray:
    """Centred moving average over ``window`` points (odd), the window shrinking at the ends. Held-out
    accuracy is measured with noise (288 prompts x 4 samples: a standard error of about 0.013); a
    3-point mean cuts it by sqrt(3) before curves are compared."""
    w = as_int(window, "window", minimum=1)
    if w % 2 == 0:
        raise ValueError(f"window must be odd, got {w}")
    y = np.asarray(y, dtype=float)
    h = w // 2
    return np.array([y[max(0, i - h): i + h + 1].mean() for i in range(y.size)])


def curves_on_grid(curves: Sequence[Curve], grid: np.ndarray, window: int = 3) -> np.ndarray:
    """One row per curve: its :func:`smooth`-ed values (``window`` 1: as measured) interpolated onto
    ``grid``, ``nan`` past its last point (a seed is never extrapolated). The rows of a band over
    seeds: ``np.nanmin(rows, 0)``, ``np.nanmax(rows, 0)``; their mean is :func:`mean_curve`."""
    grid = np.asarray(grid, dtype=float)
    rows = np.full((len(curves), grid.size), np.nan)
    for i, c in enumerate(curves):
        rows[i] = np.interp(grid, c.x, smooth(c.y, window))
        rows[i, grid > c.x[-1] + 1e-9] = np.nan
    return rows


def mean_curve(curves: Sequence[Curve], grid: np.ndarray, window: int = 3) -> np.ndarray:
    """Seeds' smoothed curves interpolated onto ``grid`` and averaged. A seed contributes only where it
    was evaluated (grid points past its last evaluation are ``nan`` for it)."""
    rows = curves_on_grid(curves, grid, window)
    with np.errstate(all="ignore"):
        return np.nanmean(rows, axis=0) if len(rows) else np.full(np.shape(grid), np.nan)


def final_accuracy(curve: Curve, last: int = 3) -> float:
    """Mean of the last ``last`` evaluations: a run's end point with a third of the eval noise."""
    return float(np.mean(curve.y[-as_int(last, "last", minimum=1):]))


def at_budget(records: Sequence[Mapping[str, Any]], budget: float, key: str = "total_rollouts",
              value: str = "held_out") -> Any:
    """``value`` of the first record whose ``key`` reaches ``budget`` (a record without ``key`` counts
    as 0): a simulated run's held-out quality at equal rollouts, or at equal steps with
    ``key="step"``. The records are those of :class:`rlcurate.sim.bridge.SimTrainer`."""
    for r in records:
        if r.get(key, 0) >= budget:
            return r[value]
    raise ValueError(f"no record reaches {key} = {budget}")


def bootstrap_mean(values: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
    """The mean of ``values`` and a percentile-bootstrap interval for it (``n_boot`` resamples with
    replacement, ``level`` coverage): ``(mean, lo, hi)``. For per-prompt values, such as a per-prompt
    gain or a paired difference between two arms, the interval is over prompts."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    idx = np.random.default_rng(seed).integers(0, x.size, size=(as_int(n_boot, "n_boot", minimum=1), x.size))
    m = x[idx].mean(1)
    return float(x.mean()), float(np.quantile(m, (1 - level) / 2)), float(np.quantile(m, (1 + level) / 2))


#: Accuracy differences below this are rounding, not measurement (an evaluation resolves about 1e-3).
_TIE = 1e-12


def _ci(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.nanpercentile(values, [50 * (1 - level), 50 * (1 + level)]) if np.isfinite(values).any() \
        else (np.nan, np.nan)
    return float(lo), float(hi)


def compare_to_baseline(curves: Mapping[str, Sequence[Curve]], baseline: str = "uniform",
                        budget: float | None = None, n_boot: int = 4000, level: float = 0.95,
                        grid_points: int = 401, seed: int = 0, gain_fraction: float = 1.0,
                        window: int = 3, last: int = 3) -> dict[str, dict[str, Any]]:
    """Rollouts (or whatever ``x`` measures) to reach the baseline's final accuracy, per strategy.

    The target is the baseline's final accuracy, the mean over its seeds of :func:`final_accuracy`
    (with ``gain_fraction`` < 1: the start plus that fraction of the baseline's gain, a target that
    strategies slower than the baseline can also reach within the budget). ``window`` is the
    smoothing of :func:`smooth` and ``last`` the evaluations :func:`final_accuracy` averages (1 and 1
    for curves measured without noise, as in the simulated world, or evaluated too rarely to average).
    A strategy's cost to target is the first crossing of its seed-averaged smoothed curve
    (:func:`mean_curve`); its ``ratio`` is that cost over the baseline's own (below 1: it gets there
    with less compute). The interval is a percentile bootstrap that resamples seeds, with replacement,
    of the strategy and of the baseline (so the target moves too); a resample whose curve never
    reaches the target counts as an infinite ratio, so an upper end of ``inf`` means "may not reach
    it within the budget". Also returned: the final accuracy at equal budget with its bootstrap
    interval, and its difference from the baseline's.

    The baseline's own ratio is 1 by construction. The resamples are drawn strategy after strategy
    from one stream: a strategy's interval depends on the order of ``curves`` and on the strategies
    before it, so two tables agree only when made from the same ``curves`` (its point estimates do not
    depend on the others).
    """
    if baseline not in curves or not curves[baseline]:
        raise ValueError(f"baseline {baseline!r} has no runs; strategies: {sorted(curves)}")
    for name, cs in curves.items():
        if not cs:
            raise ValueError(f"strategy {name!r} has no runs")
    n_boot = as_int(n_boot, "n_boot", minimum=1)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    end = budget if budget is not None else min(c.x[-1] for cs in curves.values() for c in cs)
    grid = np.linspace(0.0, float(end), as_int(grid_points, "grid_points", minimum=2))
    rng = np.random.default_rng(seed)

    # per-seed curves on the grid, once; a bootstrap resample only averages rows
    on_grid = {name: curves_on_grid(cs, grid, window) for name, cs in curves.items()}
    last = as_int(last, "last", minimum=1)
    finals = {name: np.array([final_accuracy(c, last) for c in cs]) for name, cs in curves.items()}

    def cost(rows: np.ndarray, target: float) -> float:
        with np.errstate(all="ignore"):
            y = np.nanmean(rows, axis=0)
        ok = np.isfinite(y)
        # within _TIE of the target counts as reaching it: with last = window = 1 the target is the mean of
        # the final points, which rounding may put a hair above the mean curve's final point
        return first_crossing(grid[ok], y[ok], target - _TIE)

    if not 0 < gain_fraction <= 1:
        raise ValueError(f"gain_fraction must be in (0, 1], got {gain_fraction}")
    starts = {name: np.array([c.y[0] for c in cs]) for name, cs in curves.items()}

    def target_of(finals_: np.ndarray, starts_: np.ndarray) -> np.ndarray:
        return starts_ + gain_fraction * (finals_ - starts_)

    base_rows, base_finals = on_grid[baseline], finals[baseline]
    target = float(target_of(base_finals, starts[baseline]).mean())
    base_cost = cost(base_rows, target)
    k_base = len(base_finals)
    boot_base_idx = rng.integers(0, k_base, size=(n_boot, k_base))
    boot_targets = target_of(base_finals[boot_base_idx], starts[baseline][boot_base_idx]).mean(axis=1)
    boot_base_cost = np.array([cost(base_rows[ix], t) for ix, t in zip(boot_base_idx, boot_targets)])

    out: dict[str, dict[str, Any]] = {}
    for name in curves:
        rows, fin = on_grid[name], finals[name]
        k = len(fin)
        c = cost(rows, target)
        idx = rng.integers(0, k, size=(n_boot, k))
        boot_cost = np.array([cost(rows[ix], t) for ix, t in zip(idx, boot_targets)])
        with np.errstate(all="ignore"):
            boot_ratio = np.where(np.isfinite(boot_cost), boot_cost / boot_base_cost, np.inf)
        boot_final = fin[idx].mean(axis=1)
        boot_diff = boot_final - base_finals[boot_base_idx].mean(axis=1)
        # percentiles of a sample holding inf: rank with a finite stand-in, then map it back
        big = np.where(np.isfinite(boot_ratio), boot_ratio, 1e300)
        lo, hi = (float(v) if v < 1e299 else float("inf")
                  for v in np.percentile(big, [50 * (1 - level), 50 * (1 + level)], method="lower"))
        out[name] = {
            "seeds": k,
            "target": target,
            "cost": c,
            "ratio": c / base_cost if np.isfinite(c) else float("inf"),
            "ratio_lo": lo, "ratio_hi": hi,
            "reached_share": float(np.mean(np.isfinite(boot_cost))),
            "final": float(fin.mean()),
            "final_lo": _ci(boot_final, level)[0], "final_hi": _ci(boot_final, level)[1],
            "diff": float(fin.mean() - base_finals.mean()),
            "diff_lo": _ci(boot_diff, level)[0], "diff_hi": _ci(boot_diff, level)[1],
        }
    return out
