"""The gate: when does a group of rollouts carry a learning signal? (chapter 1, *The gate*).

A prompt with pass rate p gets G rollouts with binary rewards r_1..r_G ~ Bernoulli(p). Every
baselined method (GRPO, Dr. GRPO, RLOO, pairwise preference) produces a zero update when all G
rewards are equal (RAFT only when all are wrong: it still trains on an all-correct group), so the
update passes through a *gate* that opens with probability

    u(p, G) = 1 - (1 - p)^G - p^G.

The module also gives the *advantage energy* (1/G) sum_i A_i^2 of a group, which is zero exactly
when the gate is closed, and the *effective-prompt ratio* of a batch of groups.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from rlcurate._validate import as_finite, as_int, as_probability, binom_pmf, scalar_or_array

__all__ = [
    "gate_open_prob",
    "gate_open_prob_small_p",
    "gate_max",
    "advantage_energy",
    "expected_advantage_energy",
    "effective_prompt_ratio",
    "is_mixed",
    "OUTCOMES",
    "group_outcome",
    "outcome_shares",
]

OUTCOMES = ("always_right", "always_wrong", "mixed")
"""What a group of rewards is, for a group-relative method: ``mixed`` when its rewards are not all
equal (the gate is open), else ``always_right`` when the common reward reaches the success threshold
and ``always_wrong`` otherwise. The one definition the trainer, the simulated world, the evaluation
and the audit share (chapters 1, 4, 5)."""


def gate_open_prob(p, G):
    """u(p, G) = 1 - (1-p)^G - p^G: the probability that G Bernoulli(p) rewards are not all equal.

    Chapter 1 derives it; u is 0 for G = 1, symmetric about p = 1/2 where it peaks at 1 - 2^(1-G),
    and close to G p when p << 1/G.
    """
    p_arr = as_probability(p, "p")
    G = as_int(G, "G", minimum=1)
    # 1 - (1-p)^G loses digits when p is tiny; -expm1(G log1p(-p)) keeps them.
    with np.errstate(divide="ignore"):
        some_success = -np.expm1(G * np.log1p(-p_arr))
    u = some_success - p_arr**G
    u = np.clip(u, 0.0, 1.0)
    return scalar_or_array(u, p)


def gate_open_prob_small_p(p, G):
    """The small-p approximation u(p, G) ~ G p (chapter 1); an upper bound on u for every p."""
    p_arr = as_probability(p, "p")
    G = as_int(G, "G", minimum=1)
    return scalar_or_array(G * p_arr, p)


def gate_max(G):
    """max_p u(p, G) = u(1/2, G) = 1 - 2^(1-G) (chapter 1)."""
    G = as_int(G, "G", minimum=1)
    return 1.0 - 2.0 ** (1 - G)


def _group(rewards, name="rewards") -> np.ndarray:
    r = as_finite(rewards, name)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {r.shape}")
    return r


def is_mixed(rewards, tol: float = 0.0) -> bool:
    """True when a group's rewards are not all equal (max - min > tol): the gate is open."""
    r = _group(rewards)
    return bool(r.max() - r.min() > tol)


def group_outcome(rewards, success: float = 1.0) -> str:
    """The :data:`OUTCOMES` entry of one group of rewards: ``mixed`` (max > min), else
    ``always_right`` (the common reward >= ``success``) or ``always_wrong``. A group of one reward is
    never mixed."""
    r = _group(rewards)
    if r.max() > r.min():
        return "mixed"
    return "always_right" if r[0] >= success else "always_wrong"


def outcome_shares(groups: Iterable[Sequence[float]], success: float = 1.0) -> dict[str, float]:
    """The share of each of :data:`OUTCOMES` among the non-empty ``groups`` (all 0 when there are
    none); ``shares["mixed"]`` is the effective-prompt ratio the trainer logs (chapters 1, 5)."""
    outcomes = [group_outcome(g, success) for g in groups if np.size(g)]
    n = len(outcomes)
    return {o: (sum(x == o for x in outcomes) / n if n else 0.0) for o in OUTCOMES}


def advantage_energy(rewards, kind: str = "centred", eps: float = 1e-6, ddof: int = 0) -> float:
    """The advantage energy E = (1/G) sum_i A_i^2 of one group of rewards (chapter 1).

    ``kind="centred"``: A_i = r_i - mean(r), so E is the group variance (for binary rewards
    E = p_hat (1 - p_hat)). ``kind="standardised"``: A_i = (r_i - mean) / (s + eps) with s the std of
    the group (``ddof=0`` population, ``ddof=1`` Bessel as in verl and TRL), so
    E = s_0^2 / (s + eps)^2 with s_0 the population std. Both are zero exactly when the gate is closed.
    """
    r = _group(rewards)
    if kind not in ("centred", "standardised"):
        raise ValueError(f"kind must be 'centred' or 'standardised', got {kind!r}")
    eps = float(as_finite(eps, "eps", nonnegative=True))
    ddof = as_int(ddof, "ddof", minimum=0, maximum=1)
    centred = r - r.mean()
    energy = float(np.mean(centred**2))
    if kind == "centred":
        return energy
    if r.size - ddof <= 0:
        return 0.0
    s = float(np.sqrt(np.sum(centred**2) / (r.size - ddof)))
    if s == 0.0:
        return 0.0
    return energy / (s + eps) ** 2


def expected_advantage_energy(p, G, kind: str = "centred", eps: float = 1e-6, ddof: int = 0):
    """E[(1/G) sum_i A_i^2] for G Bernoulli(p) rewards, exact by summing over the binomial count.

    Centred: E = p(1-p)(G-1)/G. Standardised: with eps -> 0 it equals u(p, G) for ddof = 0 (every
    open group has energy 1), which is why standardised GRPO behaves like a pure gate (chapter 1).
    """
    p_arr = np.atleast_1d(as_probability(p, "p"))
    G = as_int(G, "G", minimum=1)
    k = np.arange(G + 1)
    pmf = binom_pmf(G, p_arr)  # (P, G+1)
    energies = np.array([advantage_energy(np.r_[np.ones(c), np.zeros(G - c)], kind, eps, ddof) for c in k])
    out = pmf @ energies
    return float(out[0]) if np.ndim(p) == 0 else out.reshape(np.shape(p))


def effective_prompt_ratio(groups: Iterable[Sequence[float]], tol: float = 0.0) -> float:
    """The share of groups whose rewards are not all equal (chapter 1); with ``tol = 0`` it is
    ``outcome_shares(groups)["mixed"]``, which the trainer logs.

    ``groups`` is any iterable of reward sequences; they may have different lengths. A group of one
    reward is never mixed.
    """
    flags = [is_mixed(g, tol) for g in groups]
    if not flags:
        raise ValueError("groups must contain at least one group of rewards, got none")
    return float(np.mean(flags))
