"""Reinforce-Ada-Seq (Xiong et al., 2025), chapter 6, *Adaptive sampling*: rounds of rollouts until
a prompt's pool meets an exit rule, a downsample of the pool to the trained group, the pool's pass
rate as the baseline and an optional explicit correction; the strategies ``ada_seq_balanced`` and
``ada_seq_positive``. The method, its defaults and the reference code: :mod:`rlcurate.curation.ada`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["SeqRule", "AdaSeqSampler", "AdaSeqDownsample", "downsample_plan", "correction_weight",
           "AdaSeqBalancedConfig", "AdaSeqPositiveConfig", "CORRECTIONS", "POSITIVE_THRESHOLD"]

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


# ====================================================================================== registered names
@dataclass
class _AdaSeqConfig(StrategyConfig):
    """The options both Ada-Seq exits take (chapter 6)."""

    max_rounds: int = 4
    """At most this many sampling rounds per step (the released code's 4)."""
    round_repeat: int = 8
    """M, new rollouts per active prompt per round (the released code's 8)."""
    positive_threshold: float = POSITIVE_THRESHOLD
    """A rollout is positive iff its reward exceeds this (the released code's 0.7)."""
    correction: str = "none"
    """The explicit prompt weight of the "correct" step: ``"none"`` (the released code),
    ``"inverse_p"`` (1/p_hat, the v3 paper) or ``"inverse_sqrt_p"`` (1/sqrt(p_hat))."""
    reweight_classes: bool = False
    """Per-rollout weights (N_class / N) / (k_class / m) that restore the pool's class shares in the
    kept group (the estimator then follows grad p, or grad log p with ``inverse_p``)."""
    global_stat_est: bool = True
    """The advantage's baseline and std from the binarised pool (the released script); ``False``: the
    kept group's own statistics."""

    def rule(self) -> SeqRule:
        raise NotImplementedError

    def build(self) -> Curator:
        rule = self.rule()
        sampler = AdaSeqSampler(rule, self.max_rounds, self.round_repeat)
        processor = AdaSeqDownsample(rule, self.correction, self.reweight_classes,
                                     global_stat_est=self.global_stat_est)
        return Curator(Selector(), sampler, [processor], name=self.name)


@register("ada_seq_balanced")
@dataclass
class AdaSeqBalancedConfig(_AdaSeqConfig):
    """Reinforce-Ada-Seq, balanced exit (Xiong et al., 2025; chapter 6): rounds of ``round_repeat``
    rollouts until #pos >= n//2 and #neg >= n - n//2 (at most ``max_rounds``), balanced downsample to
    n = group_size, baseline p_hat of the pool (``global_stat_est=False``: the kept group's own),
    optional ``correction`` (none as the released code, ``inverse_p`` as the v3 paper) and
    ``reweight_classes``."""

    def rule(self) -> SeqRule:
        return SeqRule("balanced", 1, self.positive_threshold)


@register("ada_seq_positive")
@dataclass
class AdaSeqPositiveConfig(_AdaSeqConfig):
    """Reinforce-Ada-Seq, positive exit (chapter 6): rounds until #pos >= ``k_pos`` (1 as the
    released code), then the same downsample, baseline and corrections as ``ada_seq_balanced``."""

    k_pos: int = 1
    """A prompt leaves the rounds once its pool holds this many positives (the released code's 1)."""

    def rule(self) -> SeqRule:
        return SeqRule("positive", self.k_pos, self.positive_threshold)
