"""How many rollouts each prompt should get (chapter 3, *Allocating rollouts*).

With B prompts, n_i rollouts each and the baselined estimator of grad J_f

    g_hat = (1/B) sum_i f'(p_i) (1/n_i) sum_j (r_ij - p_i) grad log pi(a_ij | x_i),

the variance is, up to the common factor 1/B^2,

    V(n) = sum_i c_i / n_i,     c_i = f'(p_i)^2 p_i (1 - p_i) s_i,

where p_i (1 - p_i) s_i is the variance of one rollout's term (r - p_i) grad log pi: exactly
s_i = E[(r - p_i)^2 ||grad log pi||^2] / (p_i (1 - p_i)), and s_i = 1 in the idealised model that takes the
score's size as the same for every prompt and independent of the reward. Minimising V subject to
sum_i n_i = N gives the Lagrange solution n_i* proportional to sqrt(c_i) = f'(p_i) sqrt(p_i (1 - p_i) s_i). For
GRPO's arcsin objective sqrt(c_i) is constant in the idealised model, so there uniform allocation is optimal;
with the exact s_i it is not (chapter 3's oracle beats it). Passing E||grad log pi||^2 alone as s_i is worse
than either (chapter 3, the ablation of the variance model). :func:`optimal_allocation` solves the *integer*
problem with bounds exactly (greedy marginal allocation is optimal for a separable convex objective).

GVM (Yao et al., 2025) allocates n_i proportional to G_i / sqrt(p_i + alpha / p_i^(beta - 1)), with
G_i a measured gradient norm (:func:`gvm_allocation`). :func:`escalation_cost` prices a tiered
schedule such as 4, then 32, then 256 rollouts for prompts that have not been solved yet.
:func:`cross_fitted_allocation_ratio` scores the linear rule on a model's audited pass rates (chapter 3, *On the
models*).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from rlcurate._validate import as_finite, as_int, as_probability
from rlcurate.stats.objectives import Objective, get_objective, smooth_pass_rate

__all__ = [
    "variance_coefficients",
    "allocation_variance",
    "optimal_allocation",
    "continuous_allocation",
    "round_preserving_sum",
    "gvm_allocation",
    "escalation_cost",
    "escalation_cost_from_coverage",
    "cross_fitted_allocation_ratio",
    "plug_in_allocation_ratio",
]


def variance_coefficients(p, objective: str | Objective = "linear", grad_sq_norm=None):
    """c_i = f'(p_i)^2 p_i (1 - p_i) s_i, the per-prompt variance coefficient (chapter 3).

    ``grad_sq_norm`` is s_i, the per-prompt multiplier of p_i (1 - p_i) in one rollout's variance (default 1
    for every prompt, the idealised model): for the exact variance pass
    E[(r - p_i)^2 ||grad log pi||^2] / (p_i (1 - p_i)). E||grad log pi||^2 alone ignores how the score's size
    depends on the reward and misleads the allocation (chapter 3). f' is evaluated at the clipped pass rate of
    the objective, so c_i is always finite.
    """
    obj = get_objective(objective)
    p_arr = _pass_rates_1d(p)
    sig2 = np.ones_like(p_arr) if grad_sq_norm is None else np.broadcast_to(
        as_finite(grad_sq_norm, "grad_sq_norm", nonnegative=True), p_arr.shape
    )
    return obj.weight(p_arr) ** 2 * p_arr * (1 - p_arr) * sig2


def allocation_variance(c, n) -> float:
    """V(n) = sum_i c_i / n_i (chapter 3); prompts with n_i = 0 must have c_i = 0."""
    c = as_finite(c, "c", nonnegative=True)
    n = as_finite(n, "n", nonnegative=True)
    if c.shape != n.shape:
        raise ValueError(f"c and n must have the same shape, got {c.shape} and {n.shape}")
    if ((n == 0) & (c > 0)).any():
        raise ValueError("n must be > 0 wherever c > 0 (a prompt with variance and no rollouts)")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sum(np.where(n > 0, c / np.where(n > 0, n, 1), 0.0)))


MAX_BUDGET = 2**31
"""The most rollouts an allocation hands out (n (n + 1) stays exact in 64-bit integers below it)."""


def _pass_rates_1d(p) -> np.ndarray:
    """One pass rate per prompt, a 1-D array (a scalar is one prompt)."""
    arr = np.atleast_1d(as_probability(p, "p"))
    if arr.ndim != 1:
        raise ValueError(f"p must be one pass rate per prompt (a 1-D array), got an array of shape {arr.shape}")
    return arr


def _check_budget(B: int, budget, n_min: int, n_max: int | None) -> tuple[int, int, int]:
    budget = as_int(budget, "budget", minimum=0, maximum=MAX_BUDGET)
    n_min = as_int(n_min, "n_min", minimum=0)
    n_max = budget if n_max is None else as_int(n_max, "n_max", minimum=0)
    if n_max < n_min:
        raise ValueError(f"n_max ({n_max}) must be >= n_min ({n_min})")
    if budget < B * n_min:
        raise ValueError(f"budget {budget} is below n_min * prompts = {n_min} * {B} = {B * n_min}")
    if budget > B * n_max:
        raise ValueError(f"budget {budget} exceeds n_max * prompts = {n_max} * {B} = {B * n_max}")
    return budget, n_min, n_max


def optimal_allocation(p, budget: int, objective: str | Objective = "linear", n_min: int = 1,
                       n_max: int | None = None, grad_sq_norm=None) -> np.ndarray:
    """Integer rollouts per prompt minimising V(n) = sum_i c_i / n_i with sum_i n_i = budget and
    n_min <= n_i <= n_max (chapter 3).

    The unconstrained solution is n_i proportional to f'(p_i) sqrt(p_i (1 - p_i) s_i), with s_i =
    ``grad_sq_norm`` (:func:`variance_coefficients`); this
    function returns the exact integer optimum: start every prompt at n_min and hand out the
    remaining rollouts one at a time to the prompt whose variance drops most, c_i / (n_i (n_i + 1)).
    Ties (for example the arcsin objective, or prompts at p = 0 or 1 with c_i = 0) go round-robin
    in prompt order, so a uniform c gives a uniform allocation. Raises ``ValueError`` when the bounds
    make the budget impossible.
    """
    c = variance_coefficients(p, objective, grad_sq_norm)
    B = c.size
    budget, n_min, n_max = _check_budget(B, budget, n_min, n_max)
    n = _greedy_prefix(c, budget, n_min, n_max)
    remaining = budget - int(n.sum())

    def gain(i):
        if n[i] == 0:
            return np.inf if c[i] > 0 else 0.0
        return c[i] / (n[i] * (n[i] + 1))

    # Heap of (-gain, rollouts so far, prompt index): equal gains go to the prompt with fewer
    # rollouts, then to the lower index, so a uniform c gives a uniform allocation.
    heap = [(-gain(i), int(n[i]), i) for i in range(B) if n[i] < n_max]
    heapq.heapify(heap)
    while remaining > 0:
        if heap[0][0] == 0:  # every gain left is 0: the rest goes round-robin, in closed form
            return _round_robin(n, remaining, n_max)
        _, _, i = heapq.heappop(heap)
        n[i] += 1
        remaining -= 1
        if n[i] < n_max:
            heapq.heappush(heap, (-gain(i), int(n[i]), i))
    return n


def _round_robin(n: np.ndarray, remaining: int, n_max: int) -> np.ndarray:
    """Hand out ``remaining`` rollouts one at a time to the prompt with the fewest so far (then the lower
    index), none above ``n_max``: the greedy loop's order when all gains are equal, as water-filling."""
    n = n.copy()
    lo, hi = int(n.min()), n_max  # the fill level L: every prompt raised to min(L, n_max)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.sum(np.clip(mid - n, 0, None))) <= remaining:
            lo = mid
        else:
            hi = mid - 1
    fill = np.clip(lo - n, 0, None)
    n += fill
    left = remaining - int(fill.sum())
    order = [i for i in np.lexsort((np.arange(n.size), n)) if n[i] < n_max]
    for i in order[:left]:
        n[i] += 1
    return n


def _greedy_prefix(c: np.ndarray, budget: int, n_min: int, n_max: int) -> np.ndarray:
    """The state the greedy allocation passes through when every marginal gain above a threshold t
    has been taken: n_i(t) = n_min + #{k in [n_min, n_max) : c_i / (k (k + 1)) > t}. Bisection finds a
    t with sum n_i(t) <= budget, so the greedy loop has only the last few rollouts left to place and
    the result stays the exact greedy (hence optimal) allocation."""
    def n_at(t):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            x = 4 * c / t
            # (-1 + sqrt(1 + x)) / 2 written without cancellation; a prompt with c > 0 always takes
            # its first rollout (infinite gain), even when c is denormal.
            k_bound = np.where(c > 0, np.maximum(x / (2 * (1 + np.sqrt(1 + x))), 1e-300), -np.inf)
        # number of integers k >= n_min with k < k_bound, capped at n_max - n_min
        count = np.clip(np.ceil(k_bound) - n_min, 0, n_max - n_min)
        return (n_min + count).astype(np.int64)

    if c.max(initial=0.0) == 0:
        return np.full(c.size, n_min, dtype=np.int64)
    hi = float(c.max()) / max(n_min * (n_min + 1), 1) + 1.0  # no finite gain exceeds hi
    if n_at(hi).sum() > budget:  # n_min = 0 and fewer rollouts than prompts with variance
        return np.full(c.size, n_min, dtype=np.int64)
    lo = hi
    while n_at(lo).sum() <= budget and lo > 1e-300:
        lo /= 2
    if n_at(lo).sum() <= budget:
        return n_at(lo)
    for _ in range(100):  # invariant: sum n(hi) <= budget < sum n(lo)
        mid = 0.5 * (lo + hi)
        if n_at(mid).sum() <= budget:
            hi = mid
        else:
            lo = mid
    return n_at(hi)


def continuous_allocation(c, budget: float, n_min: float = 0.0, n_max: float | None = None) -> np.ndarray:
    """The real-valued minimiser of sum c_i / n_i with sum n_i = budget and n_min <= n_i <= n_max:
    n_i = clip(sqrt(c_i) / sqrt(lambda), n_min, n_max), with lambda found by bisection (chapter 3)."""
    c = as_finite(c, "c", nonnegative=True)
    B = c.size
    budget = float(as_finite(budget, "budget", nonnegative=True))
    n_max = budget if n_max is None else float(n_max)
    if budget < B * n_min - 1e-9 or budget > B * n_max + 1e-9:
        raise ValueError(f"budget {budget} is outside [{B * n_min}, {B * n_max}] for {B} prompts")
    s = np.sqrt(c)
    if s.sum() == 0:
        return np.full(B, budget / B)

    def total(scale):
        return np.clip(scale * s, n_min, n_max).sum()

    lo, hi = 0.0, 1.0
    while total(hi) < budget and hi < 1e300:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < budget else (lo, mid)
    n = np.clip(hi * s, n_min, n_max)
    if n.sum() < budget - 1e-6:  # prompts with c_i = 0 absorb what the bounds left over
        free = (s == 0) & (n < n_max)
        if free.any():
            n[free] += min((budget - n.sum()) / free.sum(), n_max - n_min)
    return n


def round_preserving_sum(x, total: int | None = None) -> np.ndarray:
    """Round non-negative reals to integers with the same sum (largest-remainder rounding), as GVM's
    ``float_to_int_preserve_sum`` does. ``total`` defaults to round(sum(x))."""
    x = as_finite(x, "x", nonnegative=True)
    total = int(round(x.sum())) if total is None else as_int(total, "total", minimum=0)
    base = np.floor(x).astype(np.int64)
    short = total - int(base.sum())
    if short < 0:
        raise ValueError(f"total {total} is below the sum of the floors {int(base.sum())}")
    frac = x - base
    order = np.lexsort((np.arange(x.size), -frac))  # largest remainder first, ties in index order
    base[order[:short]] += 1
    return base


def gvm_allocation(p, grad_norm, budget: int, alpha: float = 1e-3, beta: float = 2.0,
                   filter_threshold: float = 0.0, filter_insufficient: float = 0.0) -> np.ndarray:
    """GVM's rule (Yao et al., 2025): n_i proportional to s_i = G_i / sqrt(p_i + alpha / p_i^(beta - 1)),
    rounded to integers summing to ``budget`` (chapter 3).

    ``grad_norm`` G_i is the mean gradient norm of the accepted responses of prompt i. Prompts with
    p_i = 0 or G_i = 0 get s_i = 0 and therefore no rollouts, the weakness chapter 3 discusses.
    Defaults alpha = 1e-3, beta = 2 are those of the GVM code (s_i = G_i / sqrt(p_i + alpha / p_i)).
    The code's two filters (``em/stage_2_calc_sample_size.py``; 0 disables each, as its defaults):
    ``filter_threshold`` > 0 drops prompts with p_i above it (its run script passes 1.0, which keeps
    all), ``filter_insufficient`` > 0 drops prompts whose expected accepted responses
    p_i * budget * s_i / sum s (the shares before either filter) fall below it; the remaining shares are
    then renormalised.
    """
    p_arr = _pass_rates_1d(p)
    g = np.broadcast_to(as_finite(grad_norm, "grad_norm", nonnegative=True), p_arr.shape)
    budget = as_int(budget, "budget", minimum=0)
    alpha = float(as_finite(alpha, "alpha", nonnegative=True))
    beta = float(as_finite(beta, "beta"))
    s = np.zeros_like(p_arr)
    ok = (p_arr > 0) & (g > 0)
    s[ok] = g[ok] / np.sqrt(p_arr[ok] + alpha / p_arr[ok] ** (beta - 1))
    if s.sum() == 0:
        raise ValueError("gvm_allocation needs at least one prompt with p > 0 and grad_norm > 0")
    share = s / s.sum()
    if filter_threshold > 0:
        s = np.where(p_arr <= filter_threshold, s, 0.0)
    if filter_insufficient > 0:
        s = np.where(p_arr * budget * share >= filter_insufficient, s, 0.0)
    if s.sum() == 0:
        raise ValueError("gvm_allocation: the filters dropped every prompt")
    return round_preserving_sum(budget * s / s.sum(), budget)


def escalation_cost(p, schedule: Sequence[int] = (4, 32, 256), reuse: bool = True) -> dict:
    """Expected rollouts per prompt of a tiered schedule, from true pass rates (chapter 1).

    Every prompt first gets ``schedule[0]`` rollouts; a prompt with no success so far escalates to
    the next tier, and so on. With ``reuse=True`` earlier rollouts count toward the next tier (a
    prompt escalating from 4 to 32 draws 28 more, and reaches tier t after K_{t-1} failures); with
    ``reuse=False`` each tier starts afresh (it draws 32 more, and reaches tier t only after
    K_1 + ... + K_{t-1} failures). ``p`` is the pass rate of each prompt in a population (or a
    sample of one). Returns the expected cost, the share of prompts solved by the end of each tier,
    the share first solved at each tier, the share never solved, and the cost of giving every prompt
    the last tier.
    """
    p_arr = _pass_rates_1d(p)
    K = _tiers(schedule)
    failed_by_tier_end = np.asarray(K) if reuse else np.cumsum(K)
    with np.errstate(divide="ignore"):
        unsolved = np.array([np.mean(np.exp(n * np.log1p(-p_arr))) for n in failed_by_tier_end])
    return _tiered_cost(1.0 - unsolved, K, reuse)


def escalation_cost_from_coverage(coverage: Sequence[float], schedule: Sequence[int] = (4, 32, 256)) -> dict:
    """The same expected cost, with earlier rollouts reused, from the measured share of prompts solved
    within each tier, i.e. the pass@K curve at K = schedule (chapter 1 uses it to re-check a published
    worked example). Tiers that start afresh need the curve at the cumulative sums K_1 + ... + K_t
    instead, which a curve read at the tiers does not give: price those with :func:`escalation_cost`."""
    cov = np.atleast_1d(as_probability(coverage, "coverage"))
    K = _tiers(schedule)
    if cov.size != len(K):
        raise ValueError(f"coverage needs one value per tier ({len(K)}), got {cov.size}")
    if np.any(np.diff(cov) < -1e-12):
        raise ValueError(f"coverage must not decrease with the tier, got {cov.tolist()}")
    return _tiered_cost(cov, K, reuse=True)


def _tiers(schedule: Sequence[int]) -> list[int]:
    K = [as_int(k, "schedule entry", minimum=1) for k in schedule]
    if not K:
        raise ValueError("schedule must hold at least one tier")
    if any(b <= a for a, b in zip(K, K[1:])):
        raise ValueError(f"schedule must be strictly increasing, got {list(K)}")
    return K


def _tiered_cost(solved_by_tier_end: np.ndarray, K: list[int], reuse: bool) -> dict:
    """Cost = sum over tiers of (share that reaches tier t) x (rollouts tier t adds)."""
    cov = np.asarray(solved_by_tier_end, dtype=float)
    reach = np.r_[1.0, 1.0 - cov[:-1]]
    extra = np.diff(np.r_[0, K]) if reuse else np.asarray(K)
    cost = float(np.sum(reach * extra))
    return {
        "schedule": list(K),
        "expected_cost": cost,
        "coverage": cov,
        "first_solved_at_tier": np.diff(np.r_[0.0, cov]),
        "never_solved": float(1.0 - cov[-1]),
        "uniform_cost": float(K[-1]),
        "cost_ratio": cost / K[-1],
    }


def cross_fitted_allocation_ratio(scores, alloc_runs: int, smoothed: bool, passes: int = 1, batch: int = 16,
                                  per_prompt: int = 8, n_min: int = 2, held_out: Sequence[tuple[int, int]] | None = None,
                                  seed: int = 0, resamples: int = 2_000) -> dict:
    """V(rule) / V(uniform) of the linear objective's idealised within-prompt variance sum_i p_i (1 - p_i) / n_i on
    an audit's pass/fail ``scores`` (prompts x runs), the rule being :func:`optimal_allocation` (chapter 3, *On the
    models*).

    Steps take ``batch`` prompts in ``passes`` random passes over the pool (seeded by ``seed``) and split
    ``per_prompt * batch`` rollouts, at least ``n_min`` each; uniform gives ``per_prompt`` each. The rule allocates
    from ``alloc_runs`` of a prompt's runs (the plug-in k/n, or Beta(1, 1)-smoothed (k+1)/(n+2) where ``smoothed``);
    two other runs estimate p_i (1 - p_i) without bias (half the chance that they disagree), so the noise of the
    allocation's estimate is not scored against itself. Averaged over the ``held_out`` pairs of runs (default:
    every pair). Returns the ratio, a 95% bootstrap interval over prompts (``low``, ``high``), and the ratio on the
    prompts whose runs the rule read all agreed (``agreed``: all failed or all solved) and on the ``others``."""
    scores = _pass_fail(scores)
    n_prompts, n_runs = scores.shape
    if held_out is None:
        held_out = [(a, b) for a in range(n_runs) for b in range(a + 1, n_runs)]
    held_out = [tuple(pair) for pair in held_out]
    if not held_out or any(len(pair) != 2 or pair[0] == pair[1] or not all(0 <= j < n_runs for j in pair)
                           for pair in held_out):
        raise ValueError(f"held_out must list pairs of two distinct runs in 0..{n_runs - 1}, got {held_out!r}")
    alloc_runs = as_int(alloc_runs, "alloc_runs", 1, n_runs - 2)  # two runs are held out
    steps = _pass_steps(n_prompts, batch, passes, seed)
    rule, uniform = np.zeros(n_prompts), np.zeros(n_prompts)  # each prompt's share of the two sums
    by_agreement = np.zeros((2, 2))  # [runs agreed, not] x [rule, uniform]
    for held in held_out:
        kept = [j for j in range(n_runs) if j not in held][:alloc_runs]
        k = scores[:, kept].sum(axis=1)
        p_alloc = smooth_pass_rate(k, len(kept)) if smoothed else k / len(kept)
        var_unbiased = 0.5 * (scores[:, held[0]] != scores[:, held[1]])
        for idx, n in _allocated_steps(p_alloc, steps, per_prompt, n_min):
            rule[idx] += var_unbiased[idx] / n
            uniform[idx] += var_unbiased[idx] / per_prompt
            agreed = (k[idx] == 0) | (k[idx] == len(kept))
            for row, mask in enumerate((agreed, ~agreed)):
                by_agreement[row] += [np.sum(var_unbiased[idx][mask] / n[mask]), np.sum(var_unbiased[idx][mask]) / per_prompt]
    if uniform.sum() == 0:
        raise ValueError("no held-out pair of runs disagrees on any prompt: the audit shows no variance to allocate")
    boot = np.random.default_rng(seed + 1).integers(0, n_prompts, (resamples, n_prompts))
    low, high = np.percentile(rule[boot].sum(axis=1) / uniform[boot].sum(axis=1), [2.5, 97.5])
    with np.errstate(invalid="ignore"):  # no prompt in a class: nan
        agreed, others = by_agreement[:, 0] / by_agreement[:, 1]
    return {"ratio": float(rule.sum() / uniform.sum()), "low": float(low), "high": float(high),
            "agreed": float(agreed), "others": float(others)}


def plug_in_allocation_ratio(pass_rates, scores, smoothed: bool = False, passes: int = 1, batch: int = 16,
                             per_prompt: int = 8, n_min: int = 2, seed: int = 0) -> float:
    """V(rule) / V(uniform) of the linear objective's idealised within-prompt variance with the exact
    ``pass_rates`` p_i, the rule (:func:`optimal_allocation`) allocating from the plug-in k/K of all of a prompt's
    K runs in ``scores`` (Beta(1, 1)-smoothed where ``smoothed``): what an allocation read from an audit of K runs
    does, where the pass rates are known (a simulated pool; chapter 3, *On the models*). Steps as in
    :func:`cross_fitted_allocation_ratio`, which estimates such a ratio where they are not."""
    p = as_probability(pass_rates, "pass_rates").ravel()
    scores = _pass_fail(scores)
    if scores.shape[0] != p.size:
        raise ValueError(f"scores must have one row per pass rate ({p.size}), got {scores.shape[0]}")
    k, runs = scores.sum(axis=1), scores.shape[1]
    p_alloc = smooth_pass_rate(k, runs) if smoothed else k / runs
    variance = p * (1 - p)
    rule = uniform = 0.0
    for idx, n in _allocated_steps(p_alloc, _pass_steps(p.size, batch, passes, seed), per_prompt, n_min):
        rule, uniform = rule + np.sum(variance[idx] / n), uniform + np.sum(variance[idx]) / per_prompt
    if uniform == 0:
        raise ValueError("every pass rate is 0 or 1: no variance to allocate")
    return float(rule / uniform)


def _pass_steps(n_prompts: int, batch: int, passes: int, seed: int) -> np.ndarray:
    """The steps' prompt indices (one row a step) of ``passes`` random passes over a pool, ``batch`` a step."""
    batch = as_int(batch, "batch", 1, n_prompts)
    passes = as_int(passes, "passes", 1)
    order = np.random.default_rng(seed)
    return np.concatenate([order.permutation(n_prompts)[:n_prompts // batch * batch].reshape(-1, batch)
                           for _ in range(passes)])


def _allocated_steps(p_alloc: np.ndarray, steps: np.ndarray, per_prompt: int, n_min: int):
    """Each step's prompt indices and the rollouts :func:`optimal_allocation` (linear objective) gives them from
    the pass rates ``p_alloc``, ``per_prompt`` a prompt on average, at least ``n_min``."""
    for idx in steps:
        yield idx, optimal_allocation(p_alloc[idx], per_prompt * len(idx), "linear", n_min=n_min)


def _pass_fail(scores) -> np.ndarray:
    """``scores`` as a float prompts x runs array of 0 and 1, or a ValueError."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or not np.isin(scores, (0.0, 1.0)).all():
        raise ValueError("scores must be a prompts x runs array of 0 and 1")
    return scores
