"""Objectives over pass rates and the prompt weights they induce (chapter 2, *Objectives and weights*).

Training maximises J_f(theta) = E_x[f(p_theta(x))]. By the chain rule

    grad J_f = E_x[ f'(p) * grad p ],

so the choice of f is the choice of a per-prompt weight w(p) = f'(p):

=========  ======================  ==========================  ================================
name       f(p)                    w(p) = f'(p)                who optimises it
=========  ======================  ==========================  ================================
linear     p                       1                           REINFORCE / RLOO on raw rewards
log        log p                   1 / p                       RAFT (rejection sampling), Reinforce-Ada
power      p^alpha                 alpha p^(alpha - 1)         a family between the two (alpha<1)
arcsin     2 arcsin(sqrt p)        1 / sqrt(p (1 - p))         GRPO's standardised advantage
=========  ======================  ==========================  ================================

Estimated pass rates hit 0 and 1 where log and 1/p blow up, so every objective evaluates f and w at a
stabilised pass rate: optional Beta smoothing of counts, p_hat = (k + a) / (n + a + b), then a clip
to [delta, 1 - delta]. No NaN or infinity ever comes out.

The module also computes GRPO's *exact* finite-group weight (:func:`grpo_effective_weight`), which
chapter 2 compares with 1 / sqrt(p (1 - p)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from rlcurate._validate import as_finite, as_int, as_int_array, as_probability, binom_pmf, scalar_or_array

__all__ = [
    "Objective",
    "get_objective",
    "OBJECTIVES",
    "clip_pass_rate",
    "smooth_pass_rate",
    "grpo_effective_weight",
    "effective_weight",
]

DEFAULT_DELTA = 1e-3


def clip_pass_rate(p, delta: float = DEFAULT_DELTA):
    """clip(p, delta, 1 - delta): keeps f and f' finite near 0 and 1 (chapter 2)."""
    delta = float(as_finite(delta, "delta", nonnegative=True))
    if delta >= 0.5:
        raise ValueError(f"delta must be < 0.5, got {delta}")
    p_arr = as_probability(p, "p")
    return scalar_or_array(np.clip(p_arr, delta, 1.0 - delta), p)


def smooth_pass_rate(successes, trials, alpha: float = 1.0, beta: float = 1.0):
    """Posterior-mean pass rate under a Beta(alpha, beta) prior: (k + alpha) / (n + alpha + beta).

    Chapter 2: the Bayesian fix for the 1/p weight of prompts with zero observed successes.
    """
    k = as_int_array(successes, "successes", minimum=0)
    n = as_int_array(trials, "trials", minimum=0)
    if np.shape(k) != np.shape(n) and np.ndim(k) and np.ndim(n):
        raise ValueError(f"successes and trials must have the same shape, got {np.shape(k)} and {np.shape(n)}")
    if (k > n).any():
        raise ValueError(f"successes must not exceed trials, got {k} > {n}")
    alpha = float(as_finite(alpha, "alpha", positive=True))
    beta = float(as_finite(beta, "beta", positive=True))
    out = (k + alpha) / (n + alpha + beta)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class Objective:
    """J_f = E[f(p)] with its weight w(p) = f'(p), evaluated at clip(p, delta, 1 - delta).

    Use :func:`get_objective` to build one. ``f`` and ``weight`` accept scalars or arrays.
    """

    name: str
    _f: Callable[[np.ndarray], np.ndarray]
    _w: Callable[[np.ndarray], np.ndarray]
    delta: float = DEFAULT_DELTA
    params: tuple = ()

    def f(self, p):
        """f(p) at the clipped pass rate."""
        q = np.asarray(clip_pass_rate(p, self.delta), dtype=float)
        return scalar_or_array(self._f(q), p)

    def weight(self, p):
        """w(p) = f'(p) at the clipped pass rate (chapter 2)."""
        q = np.asarray(clip_pass_rate(p, self.delta), dtype=float)
        return scalar_or_array(self._w(q), p)

    def weight_from_counts(self, successes, trials, alpha: float = 1.0, beta: float = 1.0):
        """w at the Beta-smoothed estimate (k + alpha) / (n + alpha + beta), then clipped."""
        return self.weight(smooth_pass_rate(successes, trials, alpha, beta))

    def allocation_profile(self, p):
        """w(p) sqrt(p (1 - p)): the optimal rollouts per prompt are proportional to it when one rollout's
        variance is proportional to p (1 - p) (the idealised model of chapter 3)."""
        q = np.asarray(clip_pass_rate(p, self.delta), dtype=float)
        return scalar_or_array(self._w(q) * np.sqrt(q * (1 - q)), p)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params)
        return f"Objective({self.name!r}{extra}, delta={self.delta})"


def _linear(delta):
    return Objective("linear", lambda p: p, lambda p: np.ones_like(p), delta)


def _log(delta):
    return Objective("log", np.log, lambda p: 1.0 / p, delta)


def _power(delta, alpha: float = 0.5):
    alpha = float(as_finite(alpha, "alpha", positive=True))
    return Objective(
        "power", lambda p: p**alpha, lambda p: alpha * p ** (alpha - 1.0), delta, (("alpha", alpha),)
    )


def _arcsin(delta):
    return Objective(
        "arcsin", lambda p: 2.0 * np.arcsin(np.sqrt(p)), lambda p: 1.0 / np.sqrt(p * (1.0 - p)), delta
    )


OBJECTIVES = {"linear": _linear, "log": _log, "power": _power, "arcsin": _arcsin}


def get_objective(name: str | Objective, delta: float = DEFAULT_DELTA, **kwargs) -> Objective:
    """Build an objective by name: ``linear``, ``log``, ``power`` (``alpha``, default 0.5) or
    ``arcsin`` (GRPO's implicit objective). An :class:`Objective` is returned unchanged."""
    if isinstance(name, Objective):
        return name
    if not isinstance(name, str) or name not in OBJECTIVES:
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
    delta = float(as_finite(delta, "delta", nonnegative=True))
    if delta >= 0.5:
        raise ValueError(f"delta must be < 0.5, got {delta}")
    if name != "power" and kwargs:
        raise ValueError(f"objective {name!r} takes no parameters, got {sorted(kwargs)}")
    return OBJECTIVES[name](delta, **kwargs)


def grpo_effective_weight(p, G: int, eps: float = 1e-6, ddof: int = 1):
    """The exact weight w_G(p) that GRPO's standardised advantage puts on grad p at group size G.

    For a prompt with pass rate p, the expected GRPO update is w_G(p) * grad p with

        w_G(p) = E[A_i | r_i = 1] - E[A_i | r_i = 0],   A_i = (r_i - mean(r)) / (std(r) + eps),

    because given its own reward a rollout's score function has mean grad p / p (r = 1) or
    -grad p / (1 - p) (r = 0). The expectation sums over the other G - 1 rewards exactly.
    As G -> infinity (and eps -> 0), w_G(p) -> 1 / sqrt(p (1 - p)), the weight of the arcsin
    objective. At finite G it does not diverge: for p -> 0 the only groups that count hold a single
    success, whose advantage is (G - 1) / sqrt(G) with Bessel's std (``ddof=1``, the default, as verl
    and TRL and :func:`rlcurate.stats.advantages.standardised`) or sqrt(G - 1) with the population
    std (``ddof=0``), so w_G(0) is that value (chapter 2).
    """
    p_arr = np.atleast_1d(as_probability(p, "p"))
    G = as_int(G, "G", minimum=1)
    eps = float(as_finite(eps, "eps", nonnegative=True))
    ddof = as_int(ddof, "ddof", minimum=0, maximum=1)
    if G == 1:
        out = np.zeros_like(p_arr)
        return float(out[0]) if np.ndim(p) == 0 else out.reshape(np.shape(p))
    j = np.arange(G)  # successes among the other G - 1 rollouts

    def adv(own: int, others: np.ndarray) -> np.ndarray:
        c = others + own  # successes in the group
        mean = c / G
        var = (c * (1 - mean) ** 2 + (G - c) * mean**2) / (G - ddof)
        s = np.sqrt(var)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.where(s > 0, (own - mean) / (s + eps), 0.0)
        return a

    pmf = binom_pmf(G - 1, p_arr)
    out = pmf @ adv(1, j) - pmf @ adv(0, j)
    return float(out[0]) if np.ndim(p) == 0 else out.reshape(np.shape(p))


def effective_weight(p, G: int, advantage: Callable[[np.ndarray], np.ndarray]):
    """The exact weight w(p) that any group advantage rule puts on grad p at group size G (chapter 2).

    ``advantage`` maps a batch of reward groups, an array of shape (m, G), to advantages of the same
    shape, as the functions of :mod:`rlcurate.stats.advantages` do; it must treat the rollouts of a
    group symmetrically. With binary rewards the expected group update (1/G) sum_i A_i grad log pi(a_i)
    equals w(p) grad p with

        w(p) = E[A_i | r_i = 1] - E[A_i | r_i = 0],

    the expectation running over the other G - 1 rewards (Binomial(G - 1, p) successes), because a
    rollout's score function has mean grad p / p given r = 1 and -grad p / (1 - p) given r = 0.
    Examples: ``standardised`` gives :func:`grpo_effective_weight` (same ``eps`` and ``ddof``); ``rloo``
    gives 1 (unbiased for the linear objective); ``centred`` gives (G - 1) / G; A_i = r_i / p_hat (RAFT averaged over the
    accepted samples) gives (1 - (1 - p)^G) / p, i.e. pass@G / p.
    """
    p_arr = np.atleast_1d(as_probability(p, "p"))
    G = as_int(G, "G", minimum=1)
    if not callable(advantage):
        raise ValueError(f"advantage must be a callable on reward groups, got {advantage!r}")
    j = np.arange(G)  # successes among the other G - 1 rollouts
    others = (np.arange(G - 1)[None, :] < j[:, None]).astype(float)  # (G, G - 1): j ones, then zeros
    adv = []
    for own in (0.0, 1.0):
        groups = np.concatenate([np.full((G, 1), own), others], axis=1)
        a = np.asarray(advantage(groups), dtype=float)
        if a.shape != groups.shape:
            raise ValueError(f"advantage must return an array of shape {groups.shape}, got {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError("advantage returned NaN or infinity on a group of binary rewards")
        adv.append(a[:, 0])
    pmf = binom_pmf(G - 1, p_arr)
    out = pmf @ (adv[1] - adv[0])
    return float(out[0]) if np.ndim(p) == 0 else out.reshape(np.shape(p))
