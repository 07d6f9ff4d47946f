"""Reinforce-Ada-Est (Xiong et al., 2025), chapter 6, *Adaptive sampling*: rollouts per prompt in
proportion to the objective's weight at a decayed Beta estimate of its pass rate, all of them
trained; the strategy ``ada_est``. The method, its defaults and the reference code:
:mod:`rlcurate.curation.ada`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.ada_seq import POSITIVE_THRESHOLD, _int_at_least
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.stats.allocation import round_preserving_sum
from rlcurate.stats.objectives import get_objective

__all__ = ["AdaEstSampler", "AdaEstConfig", "bounded_proportional_allocation"]


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
        if hybrid and (objective != "log" or objective_kwargs):
            given = ", ".join([f"objective={objective!r}"] * (objective != "log")
                              + [f"objective_kwargs={objective_kwargs!r}"] * bool(objective_kwargs))
            raise ValueError(f"hybrid=True allocates n_i proportional to 1/sqrt(p_hat + eps) (the paper's Alg. 1) and "
                             f"uses no objective: drop {given}, or hybrid to allocate by the objective")
        if not hybrid and eps != 1e-3:
            raise ValueError(f"eps={eps!r} is the eps of the hybrid rule (hybrid=True); without it the objective's "
                             f"weight allocates and eps is unused")
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


@register("ada_est")
@dataclass
class AdaEstConfig(StrategyConfig):
    """Reinforce-Ada-Est (chapter 6): rollouts proportional to w(p_hat) at a decayed Beta(alpha, beta)
    estimate (prototype defaults alpha=1, beta=16, decay=0.9, ``log`` weights 1/p_hat), at least
    ``n_min`` each, ``budget_per_prompt`` (default group_size) per prompt on average, all trained;
    ``hybrid=True`` for the paper's 1/sqrt(p_hat) allocation and 1/sqrt(r_bar) weight; advantages
    with the binarised group's statistics (``global_stat_est=False``: the raw rewards')."""

    alpha: float = 1.0
    """alpha of the Beta estimate p_hat = (N_pos + alpha) / (N_tot + alpha + beta) (the prototype's 1)."""
    beta: float = 16.0
    """beta of the same estimate (the prototype's 16)."""
    decay: float = 0.9
    """lam in [0, 1] of the decayed counts N <- lam N + n after each visit (the prototype's 0.9)."""
    objective: str = "log"
    """The objective whose weight f'(p_hat) allocates the rollouts: ``log`` (1/p_hat, the prototype),
    ``power``, ``arcsin`` or ``linear`` (:func:`rlcurate.stats.get_objective`); not with ``hybrid``."""
    objective_kwargs: dict | None = None
    """Keyword arguments of the objective (e.g. its exponent for ``power``); not with ``hybrid``."""
    hybrid: bool = False
    """The paper's Alg. 1: n_i proportional to 1/sqrt(p_hat + eps) and a group weight
    1/sqrt(r_bar + eps) (use ``advantage="drgrpo"``)."""
    eps: float = 1e-3
    """eps of the hybrid rule (only with ``hybrid``)."""
    n_min: int = 1
    """Rollouts every prompt gets at least (the prototype's 1)."""
    n_max: int | None = None
    """Rollouts a prompt gets at most (``None``: no cap)."""
    budget_per_prompt: int | None = None
    """Mean rollouts per prompt (``None``: ``group_size``)."""
    positive_threshold: float = POSITIVE_THRESHOLD
    """A rollout is a success iff its reward exceeds this (counts and the binarised statistics)."""
    global_stat_est: bool = True
    """The advantage's statistics from the binarised group (the prototype's script); ``False``: the
    raw rewards' mean and std."""

    def build(self) -> Curator:
        sampler = AdaEstSampler(self.alpha, self.beta, self.decay, self.objective, self.objective_kwargs, self.hybrid,
                                self.eps, self.n_min, self.n_max, self.budget_per_prompt, self.positive_threshold,
                                self.global_stat_est)
        return Curator(Selector(), sampler, name="ada_est")
