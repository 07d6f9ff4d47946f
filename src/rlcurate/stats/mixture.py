"""The pool's pass-rate distribution from an audit: an empirical-Bayes mixture of Betas (chapters 4 and 11).

An audit gives, per prompt i, k_i successes in n_i runs. With few runs the raw shares k_i / n_i are
noisy (a prompt right in 7 of 8 runs may well have p = 0.7), so :func:`fit_beta_mixture` fits the
distribution of the pass rates themselves, a mixture of K Betas, by maximising the marginal
(beta-binomial) likelihood

    L = prod_i sum_c w_c C(n_i, k_i) B(k_i + a_c, n_i - k_i + b_c) / B(a_c, b_c),

with K = 1, 2 or 3 chosen by BIC. One Beta cannot hold a pool whose prompts pile up at both 0 and 1
and spread between (the usual shape of an LLM pool, chapter 1); three can.

What n runs identify: the first n moments of the distribution, so the share of zero-variance groups
E[p^G + (1 - p)^G] is *measured* for G <= n (:func:`measured_zero_variance` is its unbiased estimate)
and *extrapolated* by the fitted shape for G > n (:meth:`BetaMixture.zero_variance`). The audit's summary
and :mod:`rlcurate.advise` both read it this way, and say which is which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from rlcurate._validate import as_int, as_int_array
from rlcurate.stats.audit import same_value_prob

__all__ = ["BetaMixture", "fit_beta_mixture", "count_table", "measured_zero_variance", "gate_counts"]

GROUP_SIZES = (2, 4, 8, 16, 32, 64)
"""The group sizes of a gate table (the audit summary's and ``rlcurate advise``'s)."""
MIN_RUNS = 2
"""Prompts with fewer runs cannot show a mixed group; :func:`gate_counts` leaves them out."""

LOG_SHAPE_BOUNDS = (-7.0, 7.0)
"""log a and log b of every component lie here: a shape of 1e-3 is a pile at 0 or 1, 1e3 a spike."""


@dataclass(frozen=True)
class BetaMixture:
    """A mixture of Betas: weights ``w`` (summing to 1) and shapes ``a``, ``b``, one entry per component."""

    w: np.ndarray
    a: np.ndarray
    b: np.ndarray
    loglik: float = float("nan")

    @property
    def k(self) -> int:
        return int(self.w.size)

    @property
    def mean(self) -> float:
        return float(np.sum(self.w * self.a / (self.a + self.b)))

    def moment(self, j) -> np.ndarray | float:
        """E[p^j] = sum_c w_c B(a_c + j, b_c) / B(a_c, b_c)."""
        j = np.asarray(j, dtype=float)[..., None]
        out = (self.w * np.exp(special.betaln(self.a + j, self.b) - special.betaln(self.a, self.b))).sum(-1)
        return float(out) if out.ndim == 0 else out

    def zero_variance(self, G) -> np.ndarray | float:
        """E[p^G + (1 - p)^G]: the share of groups of G rollouts that all get the same reward (chapter 1)."""
        G = np.asarray(G, dtype=float)[..., None]
        base = special.betaln(self.a, self.b)
        out = (self.w * (np.exp(special.betaln(self.a + G, self.b) - base)
                         + np.exp(special.betaln(self.a, self.b + G) - base))).sum(-1)
        return float(out) if out.ndim == 0 else out

    def pdf(self, x) -> np.ndarray:
        from scipy import stats

        x = np.asarray(x, dtype=float)
        return sum(w * stats.beta.pdf(x, a, b) for w, a, b in zip(self.w, self.a, self.b))

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """``size`` pass rates drawn from the mixture."""
        comp = rng.choice(self.k, size=size, p=self.w)
        return rng.beta(self.a[comp], self.b[comp])

    def to_dict(self) -> dict:
        return {"weights": self.w.tolist(), "a": self.a.tolist(), "b": self.b.tolist(), "loglik": self.loglik}


def measured_zero_variance(successes, trials, G: int) -> float:
    """The share of groups of G rollouts that all get the same reward, measured without a model where every
    prompt has G or more runs: the mean over prompts of [C(k, G) + C(n - k, G)] / C(n, G), whose expectation
    is E[p^G + (1 - p)^G] (drawing G of a prompt's n runs without replacement; chapter 4)."""
    k, n, c = count_table(successes, trials)
    G = as_int(G, "G", minimum=1)
    if G > int(n.min()):
        raise ValueError(f"G={G} exceeds the {int(n.min())} runs of the shortest prompt; extrapolate with a fit")
    return float(sum(ci * same_value_prob([ki, ni - ki], G) for ki, ni, ci in zip(k, n, c)) / c.sum())


def gate_counts(successes, trials) -> tuple[np.ndarray, np.ndarray]:
    """The prompts a gate table is read from: those with :data:`MIN_RUNS` or more runs, as the audit summary
    and ``rlcurate advise`` both select them."""
    k = as_int_array(successes, "successes", minimum=0)
    n = as_int_array(trials, "trials", minimum=1)
    keep = n >= MIN_RUNS
    return k[keep], n[keep]


def count_table(successes, trials) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The audit as its sufficient statistic: the distinct (k, n) pairs and how many prompts have each."""
    k = as_int_array(successes, "successes", minimum=0)
    n = as_int_array(trials, "trials", minimum=1)
    if k.shape != n.shape or k.ndim != 1 or (k > n).any():
        raise ValueError("successes and trials must be 1-D of the same length, with successes <= trials")
    pairs, counts = np.unique(np.stack([k, n], axis=1), axis=0, return_counts=True)
    return pairs[:, 0], pairs[:, 1], counts.astype(float)


def _unpack(theta: np.ndarray, K: int):
    logits = np.r_[0.0, theta[:K - 1]]
    w = np.exp(logits - special.logsumexp(logits))
    return w, np.exp(theta[K - 1:2 * K - 1]), np.exp(theta[2 * K - 1:])


def _neg_loglik(theta, K, k, n, c, log_binom):
    """The negative log-likelihood and its gradient in (logits of w_2..w_K, log a, log b)."""
    w, a, b = _unpack(theta, K)
    kk, nk, nn = k[:, None], (n - k)[:, None], n[:, None]
    comp = (special.betaln(kk + a, nk + b) - special.betaln(a, b)) + np.log(w)
    norm = special.logsumexp(comp, axis=1)
    r = c[:, None] * np.exp(comp - norm[:, None])  # prompts' weight on each component
    common = special.digamma(a + b) - special.digamma(nn + a + b)
    g_a = (r * (special.digamma(kk + a) - special.digamma(a) + common)).sum(0) * a
    g_b = (r * (special.digamma(nk + b) - special.digamma(b) + common)).sum(0) * b
    g_logit = (r.sum(0) - c.sum() * w)[1:]
    return -float(np.sum(c * (log_binom + norm))), -np.r_[g_logit, g_a, g_b]


def _starts(K: int, k, n, c) -> list[np.ndarray]:
    """Starting points: components centred on quantiles of the raw shares, and piles at 0 and 1."""
    share = np.repeat(k / n, c.astype(int))
    starts = []
    for conc in (2.0, 0.5):
        means = np.clip(np.quantile(share, (np.arange(K) + 0.5) / K), 0.05, 0.95) if K > 1 else [np.clip(share.mean(), .05, .95)]
        starts.append(np.r_[np.zeros(K - 1), np.log(np.asarray(means) * conc), np.log((1 - np.asarray(means)) * conc)])
    # piles at 0 and at 1 with or without a spread between: the shapes of most LLM pools (chapter 1)
    if K == 2:
        for a, b in (([0.05, 1.0], [5.0, 1.0]), ([1.0, 5.0], [1.0, 0.05]), ([0.05, 5.0], [5.0, 0.05])):
            starts.append(np.r_[0.0, np.log(a), np.log(b)])
    if K == 3:
        starts.append(np.r_[0.0, 0.0, np.log([0.05, 1.0, 5.0]), np.log([5.0, 1.0, 0.05])])
    return starts


def fit_beta_mixture(successes, trials, components: int | None = None, start: BetaMixture | None = None) -> BetaMixture:
    """The maximum-likelihood mixture of ``components`` Betas (1 to 3; ``None``: the K of least BIC) for
    per-prompt success counts. ``start`` (a fit with that many components) replaces the default starting
    points, which makes bootstrap refits fast."""
    k, n, c = count_table(successes, trials)
    log_binom = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    if components is None:
        fits = [fit_beta_mixture(successes, trials, K) for K in (1, 2, 3)]
        N = c.sum()
        return min(fits, key=lambda f: -2 * f.loglik + (3 * f.k - 1) * np.log(N))
    K = int(components)
    if not 1 <= K <= 3:
        raise ValueError(f"components must be 1, 2 or 3, got {components!r}")
    bounds = [(-8.0, 8.0)] * (K - 1) + [LOG_SHAPE_BOUNDS] * (2 * K)
    if start is not None and start.k == K:
        logits = np.log(np.maximum(start.w, 1e-12))
        starts = [np.r_[logits[1:] - logits[0], np.log(start.a), np.log(start.b)]]
    else:
        starts = _starts(K, k, n, c)
    best = None
    for x0 in starts:
        x0 = np.clip(x0, [lo for lo, _ in bounds], [hi for _, hi in bounds])
        res = optimize.minimize(_neg_loglik, x0, args=(K, k, n, c, log_binom), method="L-BFGS-B", jac=True,
                                bounds=bounds, options={"maxiter": 500, "ftol": 1e-12, "gtol": 1e-8})
        if best is None or res.fun < best.fun:
            best = res
    w, a, b = _unpack(best.x, K)
    order = np.argsort(a / (a + b))
    return BetaMixture(w[order], a[order], b[order], loglik=-float(best.fun))
