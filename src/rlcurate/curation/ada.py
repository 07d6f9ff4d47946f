"""Reinforce-Ada (Xiong, Ye, Liao, Dong et al., 2025), chapter 6, *Adaptive sampling*.

Two ways to spend more rollouts where the signal is hard to find.

**Ada-Seq** (sequential sampling, the paper's Alg. 2). Rounds t = 1..``max_rounds``: every prompt still
active gets ``round_repeat`` (M) new rollouts; a prompt leaves when its pool satisfies the exit rule

    balanced:  #pos >= n//2  and  #neg >= n - n//2          (ada_seq_balanced)
    positive:  #pos >= k_pos                                 (ada_seq_positive, k_pos = 1)

with "positive" meaning reward > ``positive_threshold`` (0.7) and n the training group size. Then each
pool of N rollouts is *downsampled* to n: the first min(n//2, #pos) positives, negatives to fill, topped
up from whichever class has spares; a pool that never met its rule keeps a fallback group, possibly
smaller than n. The baseline is the pool's pass rate p_hat = N_pos / N, not the group's:
A_j = r_j - p_hat (``advantage="drgrpo"``, the released script's ``norm_adv_by_std_in_grpo=False``),
or GRPO standardised with the pool's mean and std (``"grpo"``, verl's ``global_stat_est``). The v3 paper
adds an explicit correction ("oversample, downsample, correct"),

    g_hat(x) = (1 / p_hat) (1/n) sum_j (r_j - p_hat) grad log pi(a_j | x),

written here into ``Group.weight`` when ``correction="inverse_p"`` (the released code has none).

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

**Ada-Est** (the paper's Alg. 1 with the public prototype's Bayesian estimate). Each prompt keeps
decayed counts, N_tot <- lam N_tot + n, N_pos <- lam N_pos + k, and the estimate
p_hat = (N_pos + alpha) / (N_tot + alpha + beta); rollouts are allocated in proportion to the
objective's weight w(p_hat) (log: 1/p_hat, as in the prototype), at least ``n_min`` each, within a total
budget of ``group_size`` per prompt; all samples are trained. ``hybrid=True`` is the paper's Alg. 1:
n_i proportional to 1/sqrt(p_hat + eps) and an extra group weight 1/sqrt(r_bar + eps).

*Graded rewards, and the statistics of the advantage.* Both variants follow the official code's
``global_stat_est=True`` (the released script's setting): a rollout is a success iff its reward
exceeds ``positive_threshold``, and the baseline p_hat and the std of the advantage are those of the
*binarised* pool (Ada-Seq: every rollout generated for the prompt this step; Ada-Est: its trained
group), :func:`rlcurate.stats.advantages.pool_advantages`. The reward itself enters with its value.
So a graded reward is judged against the pool's *pass rate*, not against the mean reward: in a group
[0, 1, .5, .5, .5, 1, .5, .5] (2 successes of 8) a partial-credit 0.5 gets A = 0.5 - 0.25 = +0.25 under
Dr. GRPO, where the raw group mean 0.5625 would give it -0.0625. The std of the binarised pool is
floored at 1 / sqrt(N) (the std of a pool with one success), so a pool without successes and graded
kept rewards gets |A| <= sqrt(N) (the official code clamps it at eps: 0.1 / 2e-6 = 50000). With 0/1
rewards everything above is the plain pool (or group) statistics. ``global_stat_est=False`` uses the
statistics of the kept group's own raw rewards instead (the official option of the same name).

Reference options not offered: Ada-Est with a learned value network V_phi(x) for p_hat (the paper's
other estimate; no released code), the Tinker port's baseline accumulated over all epochs (it is not
the verl code), and the fork-only ``min_positive_samples``, ``correct_bias``, ``diy_reweight``.

Defaults. Code (RLHFlow/Reinforce-Ada, verl): ``max_rounds=4``, ``round_repeat=8``,
``positive_threshold=0.7``, n = 4 in the released script (budget <= 32 per prompt); here n is the run's
``group_size``. Paper text examples: M = 16, N_max = 128, n = 16, K_pos = 16 or K_pos = K_neg = 8;
paper experiments: n = 4, N_max = 32. Ada-Est prototype (branch ``hanze``): alpha = 1, beta = 16,
lam = 0.9, weights 1/p_hat, at least one rollout per prompt, one generation round; the paper leaves
lam, alpha, beta, eps, N_min, N_max unspecified.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext
from rlcurate.curation.registry import register
from rlcurate.stats.advantages import centred, pool_advantages, standardised
from rlcurate.stats.allocation import round_preserving_sum
from rlcurate.stats.objectives import get_objective

__all__ = ["SeqRule", "AdaSeqSampler", "AdaSeqDownsample", "AdaEstSampler", "downsample_plan",
           "correction_weight", "seq_pool_distribution", "seq_effective_weight", "seq_expected_rollouts",
           "bounded_proportional_allocation", "ada_seq_balanced", "ada_seq_positive", "ada_est"]

log = logging.getLogger(__name__)

CORRECTIONS = ("none", "inverse_p", "inverse_sqrt_p")
POSITIVE_THRESHOLD = 0.7


def _int_at_least(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


# ====================================================================================== Ada-Seq rules
@dataclass(frozen=True)
class SeqRule:
    """Ada-Seq's exit rule: ``mode`` ``"balanced"`` (#pos >= n//2 and #neg >= n - n//2) or
    ``"positive"`` (#pos >= ``k_pos``); a rollout is positive iff reward > ``positive_threshold``."""

    mode: str = "balanced"
    k_pos: int = 1
    positive_threshold: float = POSITIVE_THRESHOLD

    def __post_init__(self):
        if self.mode not in ("balanced", "positive"):
            raise ValueError(f"mode must be 'balanced' or 'positive', got {self.mode!r}")
        _int_at_least("k_pos", self.k_pos, 1)

    def finished(self, n_pos: int, n_neg: int, n: int) -> bool:
        if self.mode == "balanced":
            return n_pos >= n // 2 and n_neg >= n - n // 2
        return n_pos >= self.k_pos

    def classes(self, rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the positive and of the negative rollouts, in pool order."""
        is_pos = np.asarray(rewards) > self.positive_threshold
        return np.flatnonzero(is_pos), np.flatnonzero(~is_pos)


def downsample_plan(n_pos: int, n_neg: int, finished: bool, mode: str, n: int) -> tuple[int, int]:
    """How many positives and negatives of a pool the trained group keeps (Reinforce-Ada's code).

    Finished pools, and every balanced pool: min(n//2, #pos) positives, negatives up to n, then
    positives again while the group is short. Unfinished ``positive`` pools (the fallback):
    ``take = min(n, N)`` rollouts of which clip(ceil(#pos / N * n), 1, take - 1) positives (as many as
    exist), negatives to fill, then positives again. The group may hold fewer than n rollouts.
    """
    if mode == "balanced" or finished:
        k_pos = min(n // 2, n_pos)
    else:
        total = n_pos + n_neg
        take = min(n, total)
        if take == 0:
            return 0, 0
        target = max(1, min(math.ceil(n_pos / total * n), take - 1))
        k_pos = min(target, n_pos)
    k_neg = min(n - k_pos, n_neg)
    k_pos += min(n - k_pos - k_neg, n_pos - k_pos)
    return k_pos, k_neg


def correction_weight(p_hat: float, correction: str, clip: float = 1e-3) -> float:
    """The explicit prompt weight of Ada-Seq's "correct" step at the pool pass rate p_hat, clipped
    below at ``clip`` so that it stays finite: ``none`` 1, ``inverse_p`` 1/p_hat (v3 paper, log
    objective), ``inverse_sqrt_p`` 1/sqrt(p_hat) (the hybrid split of the log weight)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
    q = max(float(p_hat), clip)
    if correction == "none":
        return 1.0
    if correction == "inverse_p":
        return 1.0 / q
    return 1.0 / math.sqrt(q)


# ====================================================================================== Ada-Seq parts
class AdaSeqSampler(Sampler):
    """Reinforce-Ada-Seq's rounds: ``round_repeat`` new rollouts per active prompt per round (one
    ``ctx.generate`` call per round for all active prompts), at most ``max_rounds`` rounds; a prompt
    leaves when its pool meets ``rule``. Returns one pooled group per selected prompt (every rollout
    generated for it) with ``baseline = p_hat = N_pos / N``, ``pool_size = N``,
    ``pool_successes = N_pos``. :class:`AdaSeqDownsample` then picks the trained group."""

    name = "ada_seq"
    pool_baseline = True

    def __init__(self, rule: SeqRule | None = None, max_rounds: int = 4, round_repeat: int = 8):
        self.rule = rule or SeqRule()
        self.max_rounds = _int_at_least("max_rounds", max_rounds, 1)
        self.round_repeat = _int_at_least("round_repeat", round_repeat, 1)
        self.last_rounds = 0
        self.last_finished = 0.0

    def _done(self, g: Group, n: int) -> bool:
        pos, neg = self.rule.classes(g.rewards)
        return self.rule.finished(pos.size, neg.size, n)

    def metrics(self) -> dict[str, float]:
        return {"ada_rounds": self.last_rounds, "ada_finished": self.last_finished}

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        n = ctx.group_size
        pools: list[Group | None] = [None] * len(indices)
        active = list(range(len(indices)))  # positions, so a prompt drawn twice keeps two pools
        rounds = 0
        while active and rounds < self.max_rounds:
            new = ctx.generate([indices[a] for a in active], self.round_repeat)
            for a, g in zip(active, new):
                pools[a] = g if pools[a] is None else pools[a].merge(g)
            rounds += 1
            active = [a for a in active if not self._done(pools[a], n)]
        for g in pools:
            pos, _ = self.rule.classes(g.rewards)
            g.pool_size, g.pool_successes = g.size, float(pos.size)
            g.baseline = pos.size / g.size if g.size else None
        self.last_rounds = rounds
        self.last_finished = 1.0 - len(active) / max(len(indices), 1)
        return pools


class AdaSeqDownsample(Processor):
    """Downsample each Ada-Seq pool to the trained group (:func:`downsample_plan`), keep the pool's
    p_hat as the baseline and apply the ``correction`` weight (:func:`correction_weight`).

    ``global_stat_est=False``: the advantage uses the kept group's own statistics, not the pool's
    (the pool's counts stay in ``pool_successes`` / ``pool_size`` for belief selectors).

    ``reweight_classes=True`` adds per-rollout weights (N_class / N) / (k_class / m) as token weights
    (m = kept rollouts) so that the kept group represents the pool's class shares (see the module
    docstring: it turns the estimator into one of grad p, or with ``inverse_p`` of grad log p, up to
    the error of p_hat).
    """

    name = "ada_downsample"

    def __init__(self, rule: SeqRule | None = None, correction: str = "none", reweight_classes: bool = False,
                 clip: float = 1e-3, global_stat_est: bool = True):
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
        if not 0 < clip < 1:
            raise ValueError(f"clip must lie in (0, 1), got {clip!r}")
        self.rule = rule or SeqRule()
        self.correction = correction
        self.reweight_classes = bool(reweight_classes)
        self.clip = float(clip)
        self.global_stat_est = bool(global_stat_est)

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        n = ctx.group_size
        out = []
        for g in groups:
            pos, neg = self.rule.classes(g.rewards)
            N = g.size
            if N == 0:
                out.append(g)
                continue
            fin = self.rule.finished(pos.size, neg.size, n)
            k_pos, k_neg = downsample_plan(pos.size, neg.size, fin, self.rule.mode, n)
            keep = sorted(pos[:k_pos].tolist() + neg[:k_neg].tolist())
            sub = g.subset(keep)
            p_hat = pos.size / N
            sub.pool_size, sub.pool_successes = N, float(pos.size)
            sub.baseline = p_hat if self.global_stat_est else None
            sub.weight = g.weight * correction_weight(p_hat, self.correction, self.clip)
            if self.reweight_classes and keep:
                m = len(keep)
                c_pos = (pos.size / N) / (k_pos / m) if k_pos else 0.0
                c_neg = (neg.size / N) / (k_neg / m) if k_neg else 0.0
                is_pos = sub.rewards > self.rule.positive_threshold
                tw = []
                for j, comp in enumerate(sub.completions):
                    c = c_pos if is_pos[j] else c_neg
                    base = (np.ones(len(comp.token_ids)) if sub.token_weights is None
                            else np.asarray(sub.token_weights[j], dtype=float))
                    tw.append(base * c)
                sub.token_weights = tw
            out.append(sub)
        return out


# ====================================================================================== exact analysis
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


# ====================================================================================== Ada-Est
def bounded_proportional_allocation(weights, total: int, n_min: int = 1, n_max: int | None = None) -> np.ndarray:
    """Integers n_i with sum ``total``, n_min <= n_i <= n_max, and n_i - n_min proportional to the
    weights (water-filling for the cap, then largest-remainder rounding, chapter 6).
    With n_min = 1 and no cap this is the Ada-Est prototype's rule: one rollout each, the rest in
    proportion to the weights."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights must be a 1-D array of finite non-negative numbers, got {weights!r}")
    B = w.size
    total = _int_at_least("total", total, 0)
    n_min = _int_at_least("n_min", n_min, 0)
    if n_max is not None:
        n_max = _int_at_least("n_max", n_max, n_min)
    if total < B * n_min or (n_max is not None and total > B * n_max):
        raise ValueError(f"a total of {total} rollouts cannot give {B} prompts between {n_min} and "
                         f"{n_max if n_max is not None else 'any number'} each")
    extra = float(total - B * n_min)
    cap = np.inf if n_max is None else float(n_max - n_min)
    x = np.zeros(B)
    if w.sum() == 0:
        w = np.ones(B)
    free = np.ones(B, dtype=bool)
    remaining = extra
    while remaining > 1e-12 and free.any():
        idx = np.flatnonzero(free)
        wf = w[idx] if w[idx].sum() > 0 else np.ones(idx.size)  # only zero weights left: share evenly
        share = remaining * wf / wf.sum()
        over = share >= cap - x[idx]
        if not over.any():
            x[idx] += share
            break
        for j in idx[over]:
            remaining -= cap - x[j]
            x[j] = cap
            free[j] = False
    return n_min + round_preserving_sum(x, int(round(extra)))


class AdaEstSampler(Sampler):
    """Reinforce-Ada-Est: rollouts per prompt proportional to the objective's weight at a decayed Beta
    estimate of its pass rate; all rollouts are trained.

    Per prompt (keyed by its index in the training pool): N_tot <- lam N_tot + n, N_pos <- lam N_pos + k
    after each visit, p_hat = (N_pos + alpha) / (N_tot + alpha + beta) from the counts at the start of
    the step. Allocation: n_i = n_min + (budget - B n_min) w_i / sum w, w_i = f'(p_hat_i) for
    ``objective`` (``log``: 1/p_hat as the prototype; ``power``, ``arcsin``, ``linear`` through
    :func:`rlcurate.stats.get_objective`), or w_i = 1/sqrt(p_hat_i + eps) with ``hybrid=True``, which
    also sets ``Group.weight = 1/sqrt(r_bar + eps)`` (the paper's Alg. 1; use ``advantage="drgrpo"`` for
    its A = (r - r_bar) / sqrt(r_bar + eps)). Budget: ``budget_per_prompt`` (default ``group_size``)
    times the number of prompts.

    The advantage's statistics (``global_stat_est=True``, the prototype's script): r_bar is the share of
    the group's rewards above ``positive_threshold`` and the std that of the binarised group, as for
    Ada-Seq's pool (module docstring); a graded reward keeps its value. The group then carries
    ``baseline`` = r_bar and ``pool_size`` = its size. With 0/1 rewards these are the group's own mean
    and std, which the trainer computes without them (the group carries none). ``global_stat_est=False``:
    the raw rewards' mean and std (and r_bar the raw mean in the hybrid weight).
    """

    name = "ada_est"

    def __init__(self, alpha: float = 1.0, beta: float = 16.0, decay: float = 0.9, objective: str = "log",
                 objective_kwargs: dict | None = None, hybrid: bool = False, eps: float = 1e-3, n_min: int = 1,
                 n_max: int | None = None, budget_per_prompt: int | None = None,
                 positive_threshold: float = POSITIVE_THRESHOLD, global_stat_est: bool = True):
        if not (alpha > 0 and beta > 0):
            raise ValueError(f"alpha and beta must be > 0, got {alpha!r}, {beta!r}")
        if not 0 <= decay <= 1:
            raise ValueError(f"decay must lie in [0, 1], got {decay!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        self.alpha, self.beta, self.decay, self.eps = float(alpha), float(beta), float(decay), float(eps)
        self.objective = get_objective(objective, **(objective_kwargs or {}))
        self.hybrid = bool(hybrid)
        self.n_min = _int_at_least("n_min", n_min, 0)
        self.n_max = None if n_max is None else _int_at_least("n_max", n_max, max(self.n_min, 1))
        self.budget_per_prompt = None if budget_per_prompt is None else _int_at_least(
            "budget_per_prompt", budget_per_prompt, 1)
        self.positive_threshold = float(positive_threshold)
        self.global_stat_est = bool(global_stat_est)
        self.counts: dict[int, list[float]] = {}  # index -> [N_tot, N_pos]
        self.last_allocation: list[int] = []

    def p_hat(self, indices: Sequence[int]) -> np.ndarray:
        """(N_pos + alpha) / (N_tot + alpha + beta) for each index (the prior mean when unseen)."""
        out = []
        for i in indices:
            n_tot, n_pos = self.counts.get(int(i), (0.0, 0.0))
            out.append((n_pos + self.alpha) / (n_tot + self.alpha + self.beta))
        return np.array(out, dtype=float)

    def allocation(self, indices: Sequence[int], budget: int) -> np.ndarray:
        """Rollouts per prompt for this step (from the counts as they are now)."""
        p = self.p_hat(indices)
        w = 1.0 / np.sqrt(p + self.eps) if self.hybrid else np.asarray(self.objective.weight(p), dtype=float)
        return bounded_proportional_allocation(np.atleast_1d(w), budget, self.n_min, self.n_max)

    def metrics(self) -> dict[str, float]:
        n = getattr(self, "last_allocation", None) or [0]
        return {"ada_est_max_n": max(n), "ada_est_min_n": min(n)}

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        per = self.budget_per_prompt or ctx.group_size
        n = self.allocation(indices, per * len(indices))
        groups = ctx.generate(indices, [int(k) for k in n])
        call: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for g in groups:
            k = float(np.sum(g.rewards > self.positive_threshold))
            call[g.index][0] += g.size
            call[g.index][1] += k
            r_bar = float(g.rewards.mean()) if g.size else 0.0
            if self.global_stat_est and g.size:
                r_bar = k / g.size
                if not np.isin(g.rewards, (0.0, 1.0)).all():  # graded: the binarised group's statistics
                    g.baseline, g.pool_size, g.pool_successes = r_bar, g.size, k
            if self.hybrid and g.size:
                g.weight = g.weight / math.sqrt(r_bar + self.eps)
        for i, (n_tot, n_pos) in call.items():  # one decayed update per prompt and step
            old = self.counts.get(i, [0.0, 0.0])
            self.counts[i] = [self.decay * old[0] + n_tot, self.decay * old[1] + n_pos]
        self.last_allocation = [int(k) for k in n]
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {"counts": [[i, c[0], c[1]] for i, c in sorted(self.counts.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {int(i): [float(t), float(s)] for i, t, s in state["counts"]}


# ====================================================================================== registered names
def _seq_curator(name: str, rule: SeqRule, max_rounds: int, round_repeat: int, correction: str,
                 reweight_classes: bool, global_stat_est: bool = True) -> Curator:
    sampler = AdaSeqSampler(rule, max_rounds, round_repeat)
    processor = AdaSeqDownsample(rule, correction, reweight_classes, global_stat_est=global_stat_est)
    return Curator(Selector(), sampler, [processor], name=name)


@register("ada_seq_balanced")
def ada_seq_balanced(max_rounds: int = 4, round_repeat: int = 8, positive_threshold: float = POSITIVE_THRESHOLD,
                     correction: str = "none", reweight_classes: bool = False, global_stat_est: bool = True) -> Curator:
    """Reinforce-Ada-Seq, balanced exit (Xiong et al., 2025; chapter 6): rounds of ``round_repeat``
    rollouts until #pos >= n//2 and #neg >= n - n//2 (at most ``max_rounds``), balanced downsample to
    n = group_size, baseline p_hat of the pool (``global_stat_est=False``: the kept group's own),
    optional ``correction`` (none as the released code, ``inverse_p`` as the v3 paper) and
    ``reweight_classes``."""
    rule = SeqRule("balanced", 1, positive_threshold)
    return _seq_curator("ada_seq_balanced", rule, max_rounds, round_repeat, correction, reweight_classes,
                        global_stat_est)


@register("ada_seq_positive")
def ada_seq_positive(max_rounds: int = 4, round_repeat: int = 8, positive_threshold: float = POSITIVE_THRESHOLD,
                     k_pos: int = 1, correction: str = "none", reweight_classes: bool = False,
                     global_stat_est: bool = True) -> Curator:
    """Reinforce-Ada-Seq, positive exit (chapter 6): rounds until #pos >= ``k_pos`` (1 as the
    released code), then the same downsample, baseline and corrections as ``ada_seq_balanced``."""
    rule = SeqRule("positive", k_pos, positive_threshold)
    return _seq_curator("ada_seq_positive", rule, max_rounds, round_repeat, correction, reweight_classes,
                        global_stat_est)


@register("ada_est")
def ada_est(alpha: float = 1.0, beta: float = 16.0, decay: float = 0.9, objective: str = "log",
            objective_kwargs: dict | None = None, hybrid: bool = False, eps: float = 1e-3, n_min: int = 1,
            n_max: int | None = None, budget_per_prompt: int | None = None,
            positive_threshold: float = POSITIVE_THRESHOLD, global_stat_est: bool = True) -> Curator:
    """Reinforce-Ada-Est (chapter 6): rollouts proportional to w(p_hat) at a decayed Beta(alpha, beta)
    estimate (prototype defaults alpha=1, beta=16, decay=0.9, ``log`` weights 1/p_hat), at least
    ``n_min`` each, ``budget_per_prompt`` (default group_size) per prompt on average, all trained;
    ``hybrid=True`` for the paper's 1/sqrt(p_hat) allocation and 1/sqrt(r_bar) weight; advantages
    with the binarised group's statistics (``global_stat_est=False``: the raw rewards')."""
    sampler = AdaEstSampler(alpha, beta, decay, objective, objective_kwargs, hybrid, eps, n_min, n_max,
                            budget_per_prompt, positive_threshold, global_stat_est)
    return Curator(Selector(), sampler, name="ada_est")
