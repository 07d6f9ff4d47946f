"""The exact analysis of Reinforce-Ada-Seq (chapter 6): the law of a prompt's pool at the end of
sampling (:func:`seq_pool_distribution`), the rollouts it costs (:func:`seq_expected_rollouts`) and
what the downsampled estimator is unbiased for (:func:`seq_effective_weight`). The method itself:
:mod:`rlcurate.curation.ada` and :mod:`rlcurate.curation.ada_seq`.

*What the downsampled estimator is unbiased for.* Given a rollout's own reward, its score function has
conditional mean E[grad log pi | r = 1] = grad p / p and E[grad log pi | r = 0] = -grad p / (1 - p).
Choosing rollouts *by class* (the balanced subsample) does not change these conditional means, because
which rollouts are kept depends on the rewards only. So for a kept group with k_+ positives and k_-
negatives, advantages a_+ and a_-, and a group weight w,

    E[g_hat | pool] = (w / n) (k_+ a_+ / p - k_- a_- / (1 - p)) grad p.

A balanced group (k_+ = k_- = n/2) with A = r - p_hat, p_hat ~ p, therefore has mean

    W(p) grad p,   W(p) = ((1 - p)/p + p/(1 - p)) / 2 = 1 / (2 p (1 - p)) - 1,

which is neither the linear objective's weight 1 nor the log objective's 1/p: the class-balanced
subsample already up-weights hard prompts (W ~ 1/(2p) for small p) and, symmetrically, easy ones. The
v3 correction 1/p_hat assumes an *unselective* subsample (for which E[(r - p) grad log pi] = grad p);
on top of the balanced one it gives W(p) / p ~ 1/(2 p^2): relative to grad log p it over-weights a
p = 0.1 prompt about 1/(2p(1-p)) - 1 = 4.6-fold (exactly 4.14 at the code defaults n = 4, four rounds
of 8; 2.29 at p = 0.2, 1.12 at p = 1/2, 4.16 at p = 0.9; :func:`seq_effective_weight`, chapter 6).
With the GRPO advantage standardised by the pool's std the balanced subsample's weight grows faster
still (12.6 at p = 0.1, against the arcsin objective's 1/sqrt(p(1-p)) = 3.3).
``reweight_classes=True`` undoes the selection: per-rollout weights (N_class / N) / (k_class / m) (m the
kept group's size) restore the pool's class shares, so that for a full group (m = n) holding both
classes E[g_hat | pool] = p_hat (1 - p_hat) / (p (1 - p)) grad p ~ grad p, and with
``correction="inverse_p"`` on top ~ grad p / p = grad log p (within 8% for 0.1 <= p <= 0.5 at the
code defaults). The remaining bias comes only from p_hat (a ratio estimate under a stopping rule) and
from pools that miss a class; :func:`seq_effective_weight` computes it exactly.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from rlcurate.curation.ada_seq import SeqRule, _int_at_least, correction_weight, downsample_plan
from rlcurate.stats.advantages import centred, pool_advantages, standardised

__all__ = ["seq_pool_distribution", "seq_effective_weight", "seq_expected_rollouts"]


def seq_pool_distribution(p: float, n: int, mode: str = "balanced", max_rounds: int = 4,
                          round_repeat: int = 8, k_pos: int = 1) -> list[tuple[int, int, bool, float]]:
    """The exact law of an Ada-Seq pool at the end of sampling for a prompt of pass rate ``p``:
    a list of ``(N_pos, N_neg, finished, probability)`` (chapter 6). Each round adds
    Binomial(``round_repeat``, p) positives to every unfinished pool."""
    from scipy.stats import binom

    rule = SeqRule(mode, k_pos)
    M = _int_at_least("round_repeat", round_repeat, 1)
    pmf = binom.pmf(np.arange(M + 1), M, float(p))
    active = {(0, 0): 1.0}
    done: dict[tuple[int, int, bool], float] = defaultdict(float)
    for _ in range(_int_at_least("max_rounds", max_rounds, 1)):
        nxt: dict[tuple[int, int], float] = defaultdict(float)
        for (a, b), pr in active.items():
            for k in range(M + 1):
                q = pr * pmf[k]
                if q == 0.0:
                    continue
                s = (a + k, b + M - k)
                if rule.finished(s[0], s[1], n):
                    done[(s[0], s[1], True)] += q
                else:
                    nxt[s] += q
        active = nxt
    for (a, b), pr in active.items():
        done[(a, b, False)] += pr
    return [(a, b, f, pr) for (a, b, f), pr in sorted(done.items())]


def _advantages(p_hat: float, N: int, advantage: str, eps: float,
                kept: tuple[int, int] | None = None) -> tuple[float, float]:
    """(A for a positive, A for a negative): exactly the trainer's rule, through the same function.
    With the pool's statistics (p_hat of N rollouts) :func:`rlcurate.stats.advantages.pool_advantages`;
    with ``kept`` = (k_+, k_-), the kept group's own (``global_stat_est=False``)."""
    if advantage not in ("drgrpo", "grpo"):
        raise ValueError(f"advantage must be 'drgrpo' or 'grpo' (pool baseline), got {advantage!r}")
    if kept is None:
        a = pool_advantages(np.array([1.0, 0.0]), p_hat, N, advantage, eps)
        return float(a[0]), float(a[1])
    k_pos, k_neg = kept
    r = np.r_[np.ones(k_pos), np.zeros(k_neg)]
    a = centred(r) if advantage == "drgrpo" else standardised(r, eps=eps, ddof=1)
    return (float(a[0]) if k_pos else 0.0), (float(a[-1]) if k_neg else 0.0)


def seq_effective_weight(p, n: int, mode: str = "balanced", max_rounds: int = 4, round_repeat: int = 8,
                         k_pos: int = 1, correction: str = "none", reweight_classes: bool = False,
                         advantage: str = "drgrpo", clip: float = 1e-3, eps: float = 1e-6,
                         global_stat_est: bool = True):
    """W(p) with E[g_hat] = W(p) grad p exactly, for Ada-Seq's per-prompt estimator
    g_hat = (w / n) sum_{j kept} c_j A_j grad log pi(a_j | x) (chapter 6).

    The expectation runs over the whole sampling process (:func:`seq_pool_distribution`), using
    E[grad log pi | r = 1] = grad p / p and E[grad log pi | r = 0] = -grad p / (1 - p) for each kept
    rollout; w is the correction weight at p_hat = N_pos / N, c_j the class weights of
    ``reweight_classes`` (else 1), A_j the trainer's advantage with the pool baseline (or, with
    ``global_stat_est=False``, the kept group's own statistics). Compare with
    f'(p): 1 for grad p, 1/p for grad log p. ``p`` may be an array (0 < p < 1).
    """
    p_arr = np.atleast_1d(np.asarray(p, dtype=float))
    if not ((p_arr > 0) & (p_arr < 1)).all():
        raise ValueError(f"p must lie strictly between 0 and 1, got {p!r}")
    out = np.empty_like(p_arr)
    for i, pi in enumerate(p_arr):
        W = 0.0
        for a, b, fin, pr in seq_pool_distribution(pi, n, mode, max_rounds, round_repeat, k_pos):
            N = a + b
            p_hat = a / N
            kp, kn = downsample_plan(a, b, fin, mode, n)
            m = kp + kn
            if m == 0:
                continue
            a_pos, a_neg = _advantages(p_hat, N, advantage, eps, None if global_stat_est else (kp, kn))
            c_pos = c_neg = 1.0
            if reweight_classes:
                c_pos = (a / N) / (kp / m) if kp else 0.0
                c_neg = (b / N) / (kn / m) if kn else 0.0
            w = correction_weight(p_hat, correction, clip)
            W += pr * w / n * (kp * c_pos * a_pos / pi - kn * c_neg * a_neg / (1 - pi))
        out[i] = W
    return float(out[0]) if np.ndim(p) == 0 else out


def seq_expected_rollouts(p, n: int, mode: str = "balanced", max_rounds: int = 4, round_repeat: int = 8,
                          k_pos: int = 1):
    """E[N], the expected rollouts Ada-Seq generates for a prompt of pass rate ``p`` (chapter 6)."""
    p_arr = np.atleast_1d(np.asarray(p, dtype=float))
    out = np.array([sum((a + b) * pr for a, b, _, pr in
                        seq_pool_distribution(pi, n, mode, max_rounds, round_repeat, k_pos)) for pi in p_arr])
    return float(out[0]) if np.ndim(p) == 0 else out
