"""A sound comparison of curation strategies at equal compute (chapter 10, *End to end*).

The question: trained end to end at the same budget, does a strategy reach a higher held-out
accuracy than uniform GRPO, and is the difference larger than the noise? The protocol this module
implements, and the reasons for each step:

1. **Read every run on one grid of the compute axis.** Runs evaluate each time their generated
   rollouts cross a multiple of ``eval_every_rollouts`` (:class:`rlcurate.train.TrainConfig`), so an
   arm that takes 60 steps and one that takes 200 are read at the same compute
   (:func:`grid_curve`); the end point is the accuracy at the budget (:func:`at_budget`), the area
   under the curve (:func:`area`) a second measure. Other currencies (:data:`CURRENCIES`) are read
   by interpolating each curve at a common cost (:func:`at_cost`).
2. **Tune what differs between arms** on a validation split disjoint from the test split
   (:func:`choose_lr`), then run the chosen value on the test protocol.
3. **Paired seeds with common random numbers.** A seed fixes the prompt order, the held-out prompts
   and the sampling streams of every arm, so the per-seed difference to the baseline cancels what
   the arms share; :func:`paired` gives the mean difference, a t interval (its coverage is checked on
   synthetic curves by :func:`coverage`), an exact sign-flip p-value, the t-test p-value and, across
   arms, Holm's adjustment (:func:`holm`).
4. **An A/A control**: uniform against uniform with an independent prompt order (``order_offset``).
   Its interval must cover 0, else the protocol, not a strategy, is broken.
5. **Power**: :func:`detectable_difference` is the smallest true difference the design finds with
   probability 0.8 at the adjusted level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

__all__ = ["CURRENCIES", "CURRENCY_KEYS", "GridCurve", "grid_curve", "at_budget", "area", "curve_mean", "cost", "at_cost", "choose_lr",
           "Paired", "paired", "aa_controls", "compare_arms", "holm", "sign_flip_p", "detectable_difference", "coverage",
           "resampled_coverage", "first_crossing", "rollouts_to_target", "Ratio", "ratio_table"]

CURRENCIES = {
    "rollouts": "generated rollouts",
    "cost_sparse": "generated rollouts + rho x trained rollouts (only rollouts with a non-zero advantage "
                   "are trained, as this trainer does)",
    "cost_dense": "generated rollouts + rho x kept rollouts (every rollout of a kept group is trained, "
                  "as verl does)",
    "tokens": "model tokens: generated plus trained",
    "steps": "optimizer steps (the papers' currency: extra sampling within a step is free)",
}
"""The currencies a comparison can be stated in; ``rho`` is the cost of training one rollout relative
to generating it (a timing benchmark measures it)."""


@dataclass(frozen=True)
class GridCurve:
    """One run read on the rollout grid: ``grid[k]`` the grid point (rollouts), ``rollouts[k]`` the
    rollouts actually spent at that evaluation (at or just past the grid point), ``value[k]`` the
    metric there."""

    grid: np.ndarray
    rollouts: np.ndarray
    value: np.ndarray

    @property
    def overshoot(self) -> np.ndarray:
        """Rollouts spent past each grid point when it was read (a step's rollouts at most)."""
        return self.rollouts - self.grid


def _evals(result: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [r for r in result["metrics"] if key in r]


def grid_curve(result: Mapping[str, Any], key: str = "eval/accuracy") -> GridCurve:
    """The evaluations of a reference run made on the rollout grid (``eval/grid``), in order."""
    recs = [r for r in _evals(result, key) if "eval/grid" in r]
    if not recs:
        raise ValueError(f"run {result.get('run')!r} seed {result.get('seed')!r} has no evaluations on a rollout "
                         "grid (train it with eval_every_rollouts)")
    return GridCurve(np.array([r["eval/grid"] for r in recs], dtype=float),
                     np.array([r.get("total/rollouts", 0) for r in recs], dtype=float),
                     np.array([r[key] for r in recs], dtype=float))


def at_budget(curve: GridCurve, budget: float) -> float:
    """The metric at the first grid point at or past ``budget`` (the end point of the comparison)."""
    hit = np.flatnonzero(curve.grid >= budget)
    if not hit.size:
        raise ValueError(f"it was not read at a budget of {budget:g} (its last grid point is {curve.grid[-1]:g})")
    return float(curve.value[hit[0]])


def curve_mean(x, y):
    """The mean of a piecewise-linear curve through the points (x, y) over [x[0], x[-1]] (trapezoid rule):
    the area under the curve, the book's one definition of it (chapters 10 and 11). ``y`` may hold several
    curves on the same ``x`` along its last axis (then an array, one mean per curve)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or y.shape[-1:] != x.shape or x.size < 2 or not x[-1] > x[0]:
        raise ValueError(f"a curve's mean needs two or more points spanning an interval, got x = {x.tolist()[:5]}")
    out = np.sum((x[1:] - x[:-1]) * (y[..., 1:] + y[..., :-1]) / 2, axis=-1) / (x[-1] - x[0])
    return float(out) if out.ndim == 0 else out


def area(curve: GridCurve, budget: float) -> float:
    """The mean of the metric over the grid points 0..``budget`` (trapezoid rule, normalised by the
    budget): the accuracy a run held on average while it spent its compute. A run whose last evaluation
    lies past the budget (a step that overshot it) is read at the budget by linear interpolation."""
    keep = curve.grid <= budget
    x, y = curve.grid[keep], curve.value[keep]
    if x.size and x[-1] < budget and curve.grid[-1] > budget:
        x, y = np.append(x, budget), np.append(y, np.interp(budget, curve.grid, curve.value))
    if x.size < 2 or x[-1] < budget:
        raise ValueError(f"its grid does not reach the budget {budget:g} (its last grid point is "
                         f"{curve.grid[-1]:g})")
    return curve_mean(x, y)


#: The metric totals each currency of :data:`CURRENCIES` adds up (the cost currencies weight the second by rho).
CURRENCY_KEYS = {"rollouts": ("total/rollouts",), "cost_sparse": ("total/rollouts", "total/trained_samples"),
                  "cost_dense": ("total/rollouts", "total/kept_samples"),
                  "tokens": ("total/generated_tokens", "total/trained_tokens"), "steps": ("step",)}


def _spent(result: Mapping[str, Any], recs: Sequence[Mapping[str, Any]], currency: str, rho: float) -> np.ndarray:
    """What a run had spent in ``currency`` at each of its metric records ``recs``. A record after the first
    step that lacks a total the currency needs (a run made before the trainer logged it) is refused rather
    than read as 0, which would turn a cost currency into plain rollouts."""
    if currency not in CURRENCIES:
        raise ValueError(f"currency must be one of {', '.join(CURRENCIES)}, got {currency!r}")
    keys = CURRENCY_KEYS[currency]
    lacking = sorted({k for r in recs if r.get("step", 0) > 0 for k in keys if k not in r})
    if lacking:
        raise ValueError(f"run {result.get('run')!r} seed {result.get('seed')!r} has no {', '.join(lacking)} in its "
                         f"metrics (made before the trainer logged it): it cannot be read in {currency}")

    def total(key: str) -> np.ndarray:
        return np.array([r.get(key, 0) for r in recs], dtype=float)

    weight = rho if currency.startswith("cost_") else 1.0  # the cost currencies price the second total at rho
    return total(keys[0]) + sum(weight * total(k) for k in keys[1:])


def cost(result: Mapping[str, Any], currency: str, rho: float = 1.0, key: str = "eval/accuracy") -> tuple[np.ndarray, np.ndarray]:
    """``(cost, value)`` at every evaluation of a run, the cost in ``currency`` (:data:`CURRENCIES`)."""
    recs = _evals(result, key)
    return _spent(result, recs, currency, rho), np.array([r[key] for r in recs], dtype=float)


def at_cost(result: Mapping[str, Any], currency: str, budget: float, rho: float = 1.0,
            key: str = "eval/accuracy") -> float:
    """The metric interpolated linearly at ``budget`` in ``currency`` (the run must reach it)."""
    c, v = cost(result, currency, rho, key)
    if c[-1] < budget:
        raise ValueError(f"run {result.get('run')!r} seed {result.get('seed')!r} spent {c[-1]:g} in "
                         f"{currency}, less than the budget {budget:g}")
    return float(np.interp(budget, c, v))


def spent_at(result: Mapping[str, Any], currency: str, rho: float, rollouts: float) -> float:
    """What a run had spent in ``currency`` when it had generated ``rollouts``, linearly between its
    evaluations: the budget of a cost currency is what uniform GRPO spends in the rollout budget
    (chapter 10, *In another currency*)."""
    return float(np.interp(rollouts, cost(result, "rollouts")[0], cost(result, currency, rho)[0]))


def choose_lr(scores: Mapping[float, Sequence[float]], tie: float = 0.0) -> float:
    """The learning rate with the highest mean validation score (``{lr: per-seed scores}``); ties go to
    the smaller rate, a tie being a mean within ``tie`` of the highest (a suite declares its margin)."""
    if not scores:
        raise ValueError("no learning rates to choose from")
    if tie < 0:
        raise ValueError(f"tie must be at least 0, got {tie}")
    means = {lr: float(np.mean(v)) for lr, v in scores.items()}
    best = max(means.values())
    return min(lr for lr, m in means.items() if m >= best - tie)


def sign_flip_p(d: Sequence[float]) -> float:
    """Two-sided p-value of the exact sign-flip (paired permutation) test of mean(d) = 0: the share
    of the 2^n sign patterns whose |mean| is at least the observed one (valid when the differences
    are symmetric about 0 under the null; at n = 8 it cannot go below 2/256)."""
    d = np.asarray(d, dtype=float)
    n = d.size
    if n == 0 or n > 20:
        raise ValueError(f"sign_flip_p enumerates 2^n patterns; n must lie in 1..20, got {n}")
    signs = np.array(list(product((1.0, -1.0), repeat=n)))
    means = np.abs(signs @ d) / n
    return float(np.mean(means >= abs(d.mean()) - 1e-12))


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate)."""
    names = sorted(pvalues, key=lambda k: pvalues[k])
    m = len(names)
    out, running = {}, 0.0
    for i, name in enumerate(names):
        running = max(running, min(1.0, (m - i) * pvalues[name]))
        out[name] = running
    return out


@dataclass(frozen=True)
class Paired:
    """The paired comparison of one arm with the baseline over common seeds."""

    n: int
    mean: float
    sd: float
    low: float
    high: float
    p_t: float
    p_sign_flip: float
    p_holm: float = float("nan")

    @property
    def covers_zero(self) -> bool:
        return self.low <= 0.0 <= self.high


def _t_interval(d: np.ndarray, level: float) -> tuple[float, float, float]:
    n = d.size
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else float("nan")
    return sd, float(d.mean()) - half, float(d.mean()) + half


def paired(values: Mapping[str, Mapping[int, float]], baseline: str, level: float = 0.95) -> dict[str, Paired]:
    """For every arm but ``baseline``: the per-seed differences arm - baseline over their common seeds,
    their mean, the ``level`` t interval, the two-sided t-test and sign-flip p-values, and the Holm
    adjustment of the t-test p-values across the arms."""
    base = values[baseline]
    out = {}
    for arm, by_seed in values.items():
        if arm == baseline:
            continue
        seeds = sorted(set(by_seed) & set(base))
        if len(seeds) < 2:
            raise ValueError(f"arm {arm!r} shares {len(seeds)} seed(s) with {baseline!r}; a paired comparison needs 2+")
        d = np.array([by_seed[s] - base[s] for s in seeds], dtype=float)
        sd, low, high = _t_interval(d, level)
        p_t = float(stats.ttest_1samp(d, 0.0).pvalue) if sd > 0 else (1.0 if d.mean() == 0 else 0.0)
        out[arm] = Paired(d.size, float(d.mean()), sd, low, high, p_t, sign_flip_p(d) if d.size <= 20 else float("nan"))
    adjusted = holm({a: r.p_t for a, r in out.items()})
    return {a: Paired(**{**r.__dict__, "p_holm": adjusted[a]}) for a, r in out.items()}


def aa_controls(arms, baseline: str | None = None) -> list[str]:
    """The A/A control arms of a suite by the naming rule of its files: names ending in ``_aa`` and, given the
    ``baseline``, starting with its name and an underscore (``uniform_aa``, ``uniform_order2_aa`` for
    ``uniform``): an A/A arm is the baseline's config with another prompt order, so it controls only its own
    baseline; against another baseline it is an arm like the others."""
    return [a for a in arms if a.endswith("_aa") and (baseline is None or a.startswith(baseline + "_"))]


def compare_arms(values: Mapping[str, Mapping[int, float]], baseline: str = "uniform",
                 controls: Sequence[str] | None = None, level: float = 0.95) -> dict[str, Paired]:
    """The table of a suite (chapter 10): :func:`paired` over every arm but the ``controls``, with Holm's
    adjustment across those arms, then each control (an A/A arm) paired with the baseline on its own,
    outside the family (its ``p_holm`` is its unadjusted p-value). ``controls`` defaults to the arms
    of the baseline (:func:`aa_controls`); controls without runs are skipped."""
    if controls is None:
        controls = aa_controls(values, baseline)
    family = {a: v for a, v in values.items() if a not in controls}
    if baseline not in family:
        raise ValueError(f"the baseline {baseline!r} has no values; arms: {', '.join(values)}")
    table = paired(family, baseline, level) if len(family) > 1 else {}
    for c in controls:
        if c in values:
            table[c] = paired({baseline: values[baseline], c: values[c]}, baseline, level)[c]
    return table


def detectable_difference(sd: float, n: int, arms: int = 1, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a paired t-test over ``n`` seeds detects with probability
    ``power`` at level ``alpha / arms`` (Bonferroni, which Holm's first step is), for paired
    differences of standard deviation ``sd``: (t_{1-a/2, n-1} + t_{power, n-1}) sd / sqrt(n)."""
    a = alpha / max(arms, 1)
    return float((stats.t.ppf(1 - a / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n))


def coverage(n_seeds: int = 8, reps: int = 2000, level: float = 0.95, effect: float = 0.02,
             noise: str = "normal", seed: int = 0, measure: str = "final") -> float:
    """The share of ``reps`` synthetic experiments in which :func:`paired`'s interval covers the true
    difference (the check that the nominal ``level`` holds for this design; chapter 10).

    Each experiment draws ``n_seeds`` paired learning curves on a 21-point grid,
    acc(t) = 0.7 (1 - exp(-t / tau_arm)) + s_seed + e(t), with a seed effect s shared by both arms
    (common random numbers), curves that differ by ``effect`` at the budget, and evaluation noise e
    that is AR(1) over the grid: ``normal`` (sd 0.01 in both arms), ``heavy`` (Student t with 3 degrees
    of freedom, both arms), or ``skewed`` (a centred exponential in the arm, normal noise of the same sd
    in the baseline: noise of one shape in both arms would be symmetric in their difference, which is
    what the interval is built on). ``measure`` is ``final`` (the last grid point) or ``area``
    (:func:`curve_mean` over the grid)."""
    if noise not in ("normal", "heavy", "skewed"):
        raise ValueError(f"noise must be normal, heavy or skewed, got {noise!r}")
    if measure not in ("final", "area"):
        raise ValueError(f"measure must be final or area, got {measure!r}")
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 1, 21)
    tau_b = 0.3
    base = 0.7 * (1 - np.exp(-grid / tau_b))
    target = base[-1] + effect
    tau_a = -1.0 / math.log(1 - target / 0.7)
    arm = 0.7 * (1 - np.exp(-grid / tau_a))

    def read(curves):
        return curves[..., -1] if measure == "final" else curve_mean(grid, curves)

    truth = float(read(arm) - read(base))
    hits = 0
    for _ in range(reps):
        s = rng.normal(0, 0.02, n_seeds)

        def noisy(curve, shape):
            if shape == "normal":
                e = rng.normal(0, 0.01, (n_seeds, grid.size))
            elif shape == "heavy":
                e = 0.01 * rng.standard_t(3, (n_seeds, grid.size)) / math.sqrt(3)
            else:
                e = 0.01 * (rng.exponential(1.0, (n_seeds, grid.size)) - 1.0)
            for k in range(1, grid.size):  # AR(1): evaluations of one run are correlated
                e[:, k] = 0.6 * e[:, k - 1] + 0.8 * e[:, k]
            return curve[None, :] + s[:, None] + e

        a = noisy(arm, noise)
        b = noisy(base, "normal" if noise == "skewed" else noise)
        _, low, high = _t_interval(read(a) - read(b), level)
        hits += low <= truth <= high
    return hits / reps


def resampled_coverage(differences: Sequence[Sequence[float]], n_seeds: int = 8, reps: int = 4000,
                       level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """The coverage of :func:`paired`'s ``level`` t interval when the per-seed paired differences have the
    shape of observed ones (:func:`coverage` uses synthetic noise; appendix A3 uses this on SmolLM2's runs).

    Each comparison's differences d (one per seed) are standardised, z = (d - mean d) / sd d: what is
    left is the noise's shape, since a t interval moves with the location and scales with the scale. The
    z of all comparisons are pooled (mean exactly 0), and ``reps`` experiments of ``n_seeds`` draws with
    replacement from the pool, whose true mean is 0, each get their interval. Returns ``coverage``, the
    share of intervals that hold 0, its binomial standard error ``se``, the pool's ``n``, ``skewness`` and
    ``excess_kurtosis``, and the middle 95 % of those two had the differences been normal
    (``normal_skewness``, ``normal_excess_kurtosis``). The z of n seeds are bounded by (n - 1) / sqrt(n), so a tail heavier than
    those observed is not represented; :func:`coverage`'s heavy-tailed design checks that case."""
    pool = []
    for k, d in enumerate(differences):
        d = np.asarray(d, dtype=float)
        if d.ndim != 1 or d.size < 3 or not np.isfinite(d).all():
            raise ValueError(f"comparison {k}: needs three or more finite per-seed differences, got {d.tolist()}")
        if np.ptp(d) == 0:
            raise ValueError(f"comparison {k}: its differences are all equal ({d[0]}), so they have no shape")
        pool.append((d - d.mean()) / d.std(ddof=1))
    if not pool:
        raise ValueError("no comparisons given")
    z = np.concatenate(pool)
    rng = np.random.default_rng(seed)
    draws = rng.choice(z, size=(reps, n_seeds), replace=True)
    mean, sd = draws.mean(axis=1), draws.std(axis=1, ddof=1)
    half = float(stats.t.ppf(0.5 + level / 2, n_seeds - 1)) * sd / math.sqrt(n_seeds)
    hit = float(np.mean(np.abs(mean) <= half))
    # the same pool's shape statistics had the differences been normal (z of few seeds have a negative
    # excess kurtosis even then): the middle 95 % of 2,000 such pools
    sims = []
    for size in sorted({p.size for p in pool}):
        x = rng.standard_normal((2000, sum(p.size == size for p in pool), size))
        sims.append(((x - x.mean(axis=2, keepdims=True)) / x.std(axis=2, ddof=1, keepdims=True)).reshape(2000, -1))
    sz = np.concatenate(sims, axis=1)
    shapes = np.stack([stats.skew(sz, axis=1), stats.kurtosis(sz, axis=1)], axis=1)
    lo, hi = np.percentile(shapes, [2.5, 97.5], axis=0)
    return {"coverage": hit, "se": math.sqrt(hit * (1 - hit) / reps), "n": int(z.size),
            "skewness": float(stats.skew(z)), "excess_kurtosis": float(stats.kurtosis(z)),
            "normal_skewness": (float(lo[0]), float(hi[0])), "normal_excess_kurtosis": (float(lo[1]), float(hi[1]))}


# ---------------------------------------------------------------------------------------------- tables
def sweep_table(results: Sequence[Mapping[str, Any]], budget: float) -> dict[str, dict[float, list[float]]]:
    """``{arm: {lr: [validation accuracy at the budget, per seed]}}`` from the runs of a learning-rate
    sweep whose run names end in ``_lr<value>``."""
    out: dict[str, dict[float, list[float]]] = {}
    for r in results:
        arm = r["run"].rsplit("_lr", 1)[0]
        out.setdefault(arm, {}).setdefault(float(r["config"]["lr"]), []).append(at_budget(grid_curve(r), budget))
    return out


def endpoint_values(results: Sequence[Mapping[str, Any]], measure: str, budget: float, currency: str = "rollouts",
                    rho: float = 1.0) -> dict[str, dict[int, float]]:
    """``{arm: {seed: value}}``: each run's accuracy at the budget (``measure="final"``), its area
    under the curve (``"area"``), or its accuracy at ``budget`` in another ``currency`` (``"cost"``)."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if measure in ("final", "area"):
            try:
                v = (at_budget if measure == "final" else area)(grid_curve(r), budget)
            except ValueError as exc:
                raise ValueError(f"run {r['run']!r} seed {r['seed']}: {exc}") from None
        elif measure == "cost":
            v = at_cost(r, currency, budget, rho)
        else:
            raise ValueError(f"measure must be final, area or cost, got {measure!r}")
        out.setdefault(r["run"], {})[int(r["seed"])] = v
    return out


# ------------------------------------------------------------------------------ rollouts to a target
def first_crossing(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The smallest x at which the piecewise-linear curve (x, y) reaches ``target`` (linear
    interpolation between evaluations); ``nan`` if it never does."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    above = np.nonzero(y >= target)[0]
    if above.size == 0:
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))


def rollouts_to_target(rollouts: Sequence[float], accuracy: Sequence[float], target: float) -> float:
    """The charged rollouts at which a learning curve first reaches ``target`` (:func:`first_crossing`;
    chapter 11's primary endpoint); ``inf`` when it never does."""
    x = first_crossing(rollouts, accuracy, target)
    return math.inf if math.isnan(x) else x


def target_of(start: float, endpoint: Mapping[str, Any]) -> float:
    """The accuracy a run must reach under a declared endpoint: ``target``, or the run's start accuracy plus
    ``close_gap`` of its gap to 1 (chapter 11)."""
    if "target" in endpoint:
        return float(endpoint["target"])
    return float(start) + float(endpoint["close_gap"]) * (1.0 - float(start))


def to_target_values(results: Sequence[Mapping[str, Any]], endpoint: Mapping[str, Any],
                     key: str = "eval/accuracy", currency: str = "rollouts",
                     rho: float = 1.0) -> dict[str, dict[int, float]]:
    """Rollouts to the declared target of every reference run, ``{run: {seed: rollouts}}`` (``inf`` when a
    run never reached it): the rollouts actually spent at each evaluation of the grid, linearly
    interpolated (:func:`rollouts_to_target`). With another ``currency`` (:data:`CURRENCIES`, ``rho`` the
    train/generate cost ratio of the cost currencies), what the run had spent in it when it reached the
    target (chapter 11, *In the currency you pay*)."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        c = grid_curve(r, key)
        spent = c.rollouts
        if currency != "rollouts":
            spent = _spent(r, [m for m in _evals(r, key) if "eval/grid" in m], currency, rho)
        value = rollouts_to_target(spent, c.value, target_of(c.value[0], endpoint))
        if math.isinf(value):
            _check_finished(r)
        out.setdefault(r["run"], {})[int(r["seed"])] = value
    return out


def _check_finished(result: Mapping[str, Any]) -> None:
    """Refuse a run that stopped before its end (its ``max_rollouts`` or ``steps``): one that never reached the
    target there would be counted as never reaching it, though it was not given the budget."""
    config, metrics = result.get("config") or {}, result["metrics"]
    rollouts = max((m.get("total/rollouts", 0) for m in metrics), default=0)
    step = max((m.get("step", 0) for m in metrics), default=0)
    cap, steps = config.get("max_rollouts"), config.get("steps")
    if (cap and rollouts >= cap) or (steps and step >= steps) or not (cap or steps):
        return
    end = f"max_rollouts {cap:g}" if cap else f"{steps} steps"
    raise ValueError(f"run {result.get('run')!r} seed {result.get('seed')!r} stopped at {rollouts:g} rollouts (step "
                     f"{step}), before its end ({end}), without reaching the target: it cannot count as never "
                     f"reaching it; finish it (rlcurate runs resumes it) or remove it")


@dataclass(frozen=True)
class Ratio:
    """One arm's rollouts to the target over the baseline's, paired over seeds (chapter 11).

    ``ratio`` is the geometric mean of the per-seed ratios, ``low``/``high`` its two-sided interval at
    the table's level (a t interval on the log ratios), ``p_t`` and ``p_holm`` the test of ratio = 1.
    ``saving_bound`` is the largest share of the baseline's rollouts the arm can save that the data do not
    exclude: 1 - the one-sided lower bound of the ratio at the same level (negative: even no saving is
    excluded, the arm costs more). ``censored`` counts the seeds where the arm (or the baseline) never
    reached the target in the budget; such a seed counts at the budget, which favours the arm that
    missed."""

    n: int
    ratio: float
    low: float
    high: float
    p_t: float
    p_holm: float
    saving_bound: float
    censored: int
    p_published: float = float("nan")
    """One-sided p-value of "the arm's ratio is at least the published one" (the gain is smaller than
    its paper's): small means the published gain is excluded; nan without a published figure."""
    extra_cost_bound: float = float("nan")
    """The largest extra share of the baseline's rollouts the arm can need that the data do not exclude: the
    one-sided upper bound of the ratio at the table's level, minus 1 (negative: the arm saves beyond noise)."""

    @property
    def covers_one(self) -> bool:
        return self.low <= 1.0 <= self.high

    @property
    def saving_text(self) -> str:
        """:attr:`saving_bound` for a table: a whole percentage, or ``none`` where it rounds to 0 % or below
        (the data exclude any saving; the interval says how much the arm costs instead)."""
        if math.isnan(self.saving_bound):
            return "-"
        return f"{self.saving_bound:.0%}" if round(self.saving_bound, 2) > 0 else "none"


def ratio_table(values: Mapping[str, Mapping[int, float]], baseline: str = "uniform", budget: float = math.inf,
                controls: Sequence[str] | None = None, level: float = 0.95,
                published: Mapping[str, float] | None = None) -> dict[str, Ratio]:
    """Paired ratios of rollouts to a target, arm over ``baseline`` (chapter 11): per seed
    log(arm / baseline), a t interval, Holm across the arms that are not ``controls`` (A/A arms, each
    on its own), a one-sided bound on the saving and, for arms in ``published`` (arm: the ratio its paper
    reports, e.g. 0.5 for "twice as fast"), the one-sided test against it. A value past ``budget`` (``inf``:
    the target never reached) counts as ``budget`` and is censored."""
    if controls is None:
        controls = aa_controls(values, baseline)
    logs: dict[str, dict[int, float]] = {}
    censored: dict[str, dict[int, bool]] = {}
    for arm, by_seed in values.items():
        logs[arm], censored[arm] = {}, {}
        for s, v in by_seed.items():
            v = float(v)
            if not v > 0:
                raise ValueError(f"arm {arm!r} seed {s}: rollouts to the target must be positive, got {v}")
            censored[arm][s] = not v <= budget
            logs[arm][s] = math.log(min(v, budget))
            if not math.isfinite(logs[arm][s]):
                raise ValueError(f"arm {arm!r} seed {s}: never reached the target and no finite budget was given")
    table = compare_arms(logs, baseline, controls, level)
    base_cens = censored[baseline]
    out = {}
    for arm, r in table.items():
        seeds = sorted(set(logs[arm]) & set(logs[baseline]))
        q = float(stats.t.ppf(level, r.n - 1))
        lower_one_sided, upper_one_sided = (r.mean + sign * q * r.sd / math.sqrt(r.n) for sign in (-1, 1))
        p_pub = float("nan")
        if published and arm in published:
            z = (r.mean - math.log(published[arm])) / (r.sd / math.sqrt(r.n)) if r.sd > 0 else math.inf
            p_pub = float(stats.t.sf(z, r.n - 1))
        out[arm] = Ratio(r.n, math.exp(r.mean), math.exp(r.low), math.exp(r.high), r.p_t, r.p_holm,
                         1.0 - math.exp(lower_one_sided),
                         sum(censored[arm][s] or base_cens[s] for s in seeds), p_pub,
                         math.exp(upper_one_sided) - 1.0)
    return out
