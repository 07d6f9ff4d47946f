"""Metrics of a variance audit from a score matrix (chapter 4, *The variance audit*).

An audit runs a model N times on each sample and records a score per run. Rows may have different
lengths (an interrupted audit, or more runs on some samples). From the matrix we get per-sample mean,
best, worst, variance and standard deviation; the three categories (always right, always wrong,
mixed); best-of-n against mean (improvement potential); and the statistics of how reliable a
zero-variance verdict is: a prompt with pass rate p looks zero-variance in n runs with probability

    P(zero variance | p, n) = p^n + (1 - p)^n.

What the audit says about group sizes is keyed on the gate u(p, G) = 1 - p^G - (1-p)^G of chapter 1:
:func:`group_mixed_prob` estimates, without bias, the share of prompts whose group of G <= n
rollouts is mixed; a Beta-mixture fit of the pass rates (:mod:`rlcurate.stats.mixture`) extrapolates
it to larger G. A single Beta prior (:func:`fit_beta_prior`, checked by :func:`prior_degeneracy`) gives
the chance that a uniform-looking prompt hides signal. The share-only multiplier rule of the published recipe
(:func:`recipe_multiplier_rule`) is kept only so that chapter 4 can show why it is not well defined.
"""

from __future__ import annotations



import numpy as np
from scipy import optimize, special
from scipy import stats as _sps

from rlcurate._validate import as_finite, as_int, as_int_array, as_probability, as_scalar
from rlcurate.stats.gate import OUTCOMES, group_outcome

__all__ = [
    "as_score_rows",
    "sample_metrics",
    "categorize",
    "CATEGORIES",
    "category_counts",
    "improvement_potential",
    "zero_variance_prob",
    "runs_needed",
    "share_interval",
    "fit_beta_prior",
    "prior_degeneracy",
    "PRIOR_MAX_CONCENTRATION",
    "PRIOR_MIN_SHAPE",
    "hidden_signal_prob",
    "group_mixed_prob",
    "threshold_side",
    "recipe_multiplier_rule",
]

CATEGORIES = OUTCOMES


def as_score_rows(scores) -> list[np.ndarray]:
    """Validate a (possibly ragged) score matrix: a non-empty list of non-empty rows of finite numbers."""
    if isinstance(scores, np.ndarray) and scores.ndim == 2:
        rows = list(scores.astype(float))
    else:
        try:
            rows = [np.asarray(r, dtype=float) for r in scores]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"scores must be a list of rows of numbers, got {type(scores).__name__}") from exc
    if not rows:
        raise ValueError("scores must hold at least one row (sample), got none")
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"scores row {i} must be a non-empty 1-D sequence of runs, got shape {r.shape}")
        if not np.isfinite(r).all():
            raise ValueError(f"scores row {i} holds NaN or infinity: {r.tolist()}")
    return rows


def sample_metrics(scores) -> dict[str, np.ndarray]:
    """Per-sample ``n_runs``, ``mean``, ``best``, ``worst``, ``variance`` and ``std`` (population,
    ddof = 0, as in the usual audit script) of a score matrix (chapter 4)."""
    rows = as_score_rows(scores)
    return {
        "n_runs": np.array([r.size for r in rows]),
        "mean": np.array([r.mean() for r in rows]),
        "best": np.array([r.max() for r in rows]),
        "worst": np.array([r.min() for r in rows]),
        "variance": np.array([r.var() for r in rows]),
        "std": np.array([r.std() for r in rows]),
    }


def categorize(scores, success: float = 1.0) -> np.ndarray:
    """Category of each sample (:func:`rlcurate.stats.gate.group_outcome` of its scores): ``mixed``
    when its scores are not all equal, else ``always_right`` when the constant score is >=
    ``success`` and ``always_wrong`` otherwise (chapter 4).

    Only ``mixed`` samples give a group-relative method a non-zero update, whatever their mean.
    """
    return np.array([group_outcome(r, success) for r in as_score_rows(scores)])


def category_counts(scores, success: float = 1.0) -> dict[str, int]:
    """How many samples fall in each of :data:`CATEGORIES`."""
    cats = categorize(scores, success)
    return {c: int((cats == c).sum()) for c in CATEGORIES}


def improvement_potential(scores) -> dict[str, float]:
    """Mean score, best-of-n score and their difference (chapter 4).

    With 0/1 scores the best-of-n average is the share of samples solved at least once in n runs: an
    estimate of pass@n, and from below of coverage (the share the policy can solve at all). It is not a
    ceiling on what training reaches (chapter 4 shows RL passing the best-of-4 average).
    ``relative_gain`` is (best - mean) / mean (NaN-free: 0 when the mean is 0 and so is the gain).
    """
    m = sample_metrics(scores)
    current = float(m["mean"].mean())
    best = float(m["best"].mean())
    gain = best - current
    return {
        "mean": current,
        "best_of_n": best,
        "gain": gain,
        "relative_gain": gain / current if current > 0 else (0.0 if gain == 0 else float("inf")),
    }


def zero_variance_prob(p, n):
    """P(all n runs agree | pass rate p) = p^n + (1 - p)^n (chapter 4)."""
    p_arr = as_probability(p, "p")
    n_arr = as_int_array(n, "n", minimum=1)
    out = p_arr**n_arr + (1 - p_arr) ** n_arr
    return float(out) if np.ndim(out) == 0 else out


def runs_needed(p, miss: float = 0.05, n_max: int = 100_000):
    """Smallest n with p^n + (1 - p)^n <= ``miss``: runs an audit needs so that a prompt with pass
    rate p is classified as mixed with probability at least 1 - miss (chapter 4).

    p must lie strictly inside (0, 1) (at 0 or 1 no number of runs shows variance).
    """
    p_arr = np.atleast_1d(as_probability(p, "p"))
    miss = float(as_finite(miss, "miss"))
    if not 0 < miss < 1:
        raise ValueError(f"miss must lie in (0, 1), got {miss}")
    if ((p_arr <= 0) | (p_arr >= 1)).any():
        bad = p_arr[(p_arr <= 0) | (p_arr >= 1)][0]
        raise ValueError(f"p must lie strictly inside (0, 1) for a finite number of runs, got {bad}")
    out = np.empty(p_arr.shape, dtype=np.int64)
    for i, q in enumerate(p_arr.flat):  # elementwise, whatever the shape
        # (1 - q)^n + q^n is decreasing in n; start from the bound from the larger term alone.
        big = max(q, 1 - q)
        n = max(1, int(np.floor(np.log(miss) / np.log(big))))
        while n > 1 and q ** (n - 1) + (1 - q) ** (n - 1) <= miss:
            n -= 1
        while q**n + (1 - q) ** n > miss:
            n += 1
            if n > n_max:
                raise ValueError(f"more than n_max={n_max} runs needed for p={q}")
        out.flat[i] = n
    return int(out[0]) if np.ndim(p) == 0 else out


def share_interval(k: int, n: int, level: float = 0.95, prior: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Bayesian credible interval for a share from k of n (e.g. mixed samples of an audit).

    Posterior Beta(k + a, n - k + b) with prior Beta(a, b) (uniform by default); returns the posterior
    mean and the equal-tailed interval at ``level`` (chapter 4).
    """
    n = as_int(n, "n", minimum=0)
    k = as_int(k, "k", minimum=0, maximum=n)
    level = float(as_finite(level, "level"))
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    a, b = (float(x) for x in as_finite(prior, "prior", positive=True))
    post = _sps.beta(k + a, n - k + b)
    lo, hi = post.ppf([(1 - level) / 2, (1 + level) / 2])
    return {"share": k / n if n else float("nan"), "mean": float(post.mean()), "low": float(lo),
            "high": float(hi), "level": level}


def fit_beta_prior(successes, trials) -> tuple[float, float]:
    """Maximum-likelihood Beta(a, b) prior of pass rates from per-sample success counts
    (a beta-binomial fit; empirical Bayes for :func:`hidden_signal_prob`, chapter 4)."""
    k = as_int_array(successes, "successes", minimum=0)
    n = as_int_array(trials, "trials", minimum=1)
    if k.shape != n.shape or k.ndim != 1:
        raise ValueError(f"successes and trials must be 1-D of the same length, got {k.shape} and {n.shape}")
    if (k > n).any():
        raise ValueError("successes must not exceed trials")
    if k.size < 2:
        raise ValueError(f"need at least 2 samples to fit a prior, got {k.size}")

    def nll(log_ab):
        a, b = np.exp(log_ab)
        return -np.sum(special.betaln(k + a, n - k + b) - special.betaln(a, b))

    m = (k / n).mean()
    m = min(max(m, 0.05), 0.95)
    res = optimize.minimize(nll, x0=np.log([m, 1 - m]), method="Nelder-Mead",
                            options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
    a, b = np.exp(np.clip(res.x, -20, 20))
    return float(a), float(b)


PRIOR_MAX_CONCENTRATION = 1e4
"""A fitted Beta(a, b) with a + b above this has (almost) no spread: every prompt has about the same
pass rate and the spread of the counts is binomial noise (the fit runs off to infinity)."""
PRIOR_MIN_SHAPE = 1e-3
"""A fitted Beta(a, b) with a or b below this puts (almost) all pass rates at exactly 0 or 1."""


def prior_degeneracy(a: float, b: float) -> str | None:
    """``None`` for a usable Beta(a, b) prior fit, else why it is degenerate (chapter 4): the
    maximum-likelihood fit runs off to a + b -> infinity when the prompts differ no more than binomial
    noise allows (all prompts alike), and to a -> 0 or b -> 0 when the pass rates pile up at 0 or 1
    (samples right or wrong on every run, few or no mixed ones). A degenerate fit's parameters are
    artefacts of where the optimiser stopped and predict nothing."""
    for x, n in ((a, "a"), (b, "b")):  # one number each (a fit that ran off may give inf or nan: reported below)
        if np.ndim(x) or not isinstance(x, (int, float, np.number)) or isinstance(x, bool):
            raise ValueError(f"{n} must be one number, got {x!r}")
    a, b = float(a), float(b)
    if not (np.isfinite(a) and np.isfinite(b)) or a + b > PRIOR_MAX_CONCENTRATION:
        return "no spread between prompts beyond run-to-run noise: all prompts alike"
    if min(a, b) < PRIOR_MIN_SHAPE:
        return "the pass rates pile up at 0 and 1: too few mixed prompts to fit a spread"
    return None


def hidden_signal_prob(n_runs: int, all_right: bool, extra_runs: int, prior: tuple[float, float]) -> float:
    """Probability that a sample that agreed on all ``n_runs`` runs would show a mixed group if given
    ``extra_runs`` more, under a Beta ``prior`` of pass rates (chapter 4).

    After n failures the posterior is Beta(a, b + n), and the sample turns out mixed as soon as one of
    the m new runs succeeds: 1 - E[(1 - p)^m] = 1 - B(a, b + n + m) / B(a, b + n). An always-right
    sample is the mirror image (swap a and b).
    """
    n = as_int(n_runs, "n_runs", minimum=1)
    m = as_int(extra_runs, "extra_runs", minimum=1)
    a, b = (float(x) for x in as_finite(prior, "prior", positive=True))
    if all_right:
        a, b = b, a  # by symmetry: count failures among future runs of a sample that always succeeded
    return float(-np.expm1(special.betaln(a, b + n + m) - special.betaln(a, b + n)))


def group_mixed_prob(scores, G: int) -> np.ndarray:
    """Per sample, the chance that G of its n recorded runs, drawn without replacement, do not all
    have the same score (chapter 4): 1 - sum_v C(n_v, G) / C(n, G) over its distinct scores v with
    n_v runs each. For 0/1 scores and k successes it is 1 - [C(k, G) + C(n - k, G)] / C(n, G), whose
    expectation is the gate u(p, G) = 1 - p^G - (1-p)^G, so the mean over samples is an unbiased
    estimate of the share of prompts whose group of G rollouts would be mixed. Needs G <= n for every
    sample; at G = n it is 1 for a mixed sample and 0 for a uniform one."""
    rows = as_score_rows(scores)
    G = as_int(G, "G", minimum=1)
    short = min(r.size for r in rows)
    if G > short:
        raise ValueError(f"G={G} exceeds the {short} runs of the shortest sample; it cannot be estimated "
                         "without a model of the pass rates")
    out = np.array([1.0 - same_value_prob(np.unique(r, return_counts=True)[1], G) for r in rows])
    return np.clip(out, 0.0, 1.0)


def same_value_prob(value_counts, G: int) -> float:
    """For one prompt whose n runs take distinct values with counts n_v: the chance that G of them, drawn
    without replacement, all have the same value, sum_v C(n_v, G) / C(n, G) (chapter 4). For 0/1 scores,
    [C(k, G) + C(n - k, G)] / C(n, G), an unbiased estimate of p^G + (1 - p)^G."""
    n_v = np.asarray(value_counts)
    return float(special.comb(n_v, G).sum() / special.comb(n_v.sum(), G))


def threshold_side(low: float, high: float, threshold: float) -> str:
    """Where an interval [low, high] lies against a threshold (chapter 4): ``"below"`` when
    high < threshold, ``"above"`` when low >= threshold, ``"straddles"`` otherwise, in which case a
    verdict must say that it cannot tell."""
    low, high, threshold = (as_scalar(x, name) for x, name in
                            ((low, "low"), (high, "high"), (threshold, "threshold")))
    if low > high:
        raise ValueError(f"low must not exceed high, got {low} > {high}")
    if high < threshold:
        return "below"
    if low >= threshold:
        return "above"
    return "straddles"


def recipe_multiplier_rule(mixed_share: float) -> dict:
    """The published recipe's rollout multiplier from the mixed share alone, reproduced for chapter 4,
    which shows that it is not well defined: below 10% the data are too easy or too hard; 10-15%
    2-4x rollouts; 15-30% 1-2x; above 30% 1x. The same data give another share with another number of
    audit runs, and two populations with the same share gain very differently from larger groups
    (chapter 4, *What the multiplier thresholds mean*). The audit summary does not use it; it reports
    the gate by group size instead (:func:`group_mixed_prob`)."""
    s = as_scalar(as_probability(mixed_share, "mixed_share"), "mixed_share")
    if s < 0.10:
        return {"multiplier": None, "verdict": "warning",
                "advice": "fewer than 10% mixed samples: the data are mostly too easy or too hard; "
                          "re-audit with more runs, change the data, or add hints before RL"}
    if s < 0.15:
        return {"multiplier": (2, 4), "verdict": "low", "advice": "10-15% mixed: use 2-4x rollouts per prompt"}
    if s <= 0.30:
        return {"multiplier": (1, 2), "verdict": "medium", "advice": "15-30% mixed: use 1-2x rollouts per prompt"}
    return {"multiplier": (1, 1), "verdict": "high", "advice": "over 30% mixed: 1x rollouts may suffice"}
