"""Knapsack-RL (Li et al., 2025, arXiv 2509.25849), chapter 11, *When does curation pay?*: the step's
rollouts shared among its prompts by a knapsack, at exactly uniform GRPO's total.

Each prompt of the step is an item; giving it N rollouts is worth (the paper's value function)

    value(N, p) = (1 - p^N - (1 - p)^N) * p (1 - p)^2,

the probability that its group is mixed (the gate, chapter 1) times an information gain p (1 - p)^2,
at its estimated pass rate p. A dynamic programme picks the extra rollouts above a floor that maximise
the summed value under the budget B * n. The official code (``liziniu/KnapsackRL``,
``verl/trainer/ppo/exploration_utils.py``; read in ``data/specs/greso_knapsack.md``, part B) is
reproduced step by step, and ``tests/test_fidelity.py`` checks it on the vectors executed against that
code:

1. a prompt with fewer than ``min_buffer_length`` rollouts in its history gets ``n`` rollouts, outside
   the programme; one with p = 0 gets ``negative_n``, with p = 1 ``positive_n``, with 0 < p < 1 (an
   *effective* prompt) ``min_n`` plus its share of the programme;
2. no effective prompt: what remains goes in equal parts to the prompts with p = 0 and the unseen ones
   (every prompt gets ``n`` if there are none);
3. otherwise, with ``allow_fallback``, if the rollouts the effective prompts "need",
   sum_i int(min(max_n, log(1 - alpha) / log(max(p_i, 1 - p_i)))), fall short of what remains, the
   excess goes in equal parts to the p = 0 and unseen prompts (to every non-effective one if there are
   none) and the programme gets the rest;
4. the programme: extra k_i in {0, ..., max_n - min_n} per effective prompt, k = 0 worth 0 and k >= 1
   worth value(min_n + k, p_i), the sum of k exactly the programme's budget (if that cannot be reached,
   the largest reachable sum, the rest in equal parts to the effective prompts); ties go to the smaller
   k, the choice is traced back from the last prompt.

The pass rate of a prompt is the mean of its last visit if that visit had at least
``reward_buffer_length`` rollouts, else the mean of its ``reward_buffer_length`` latest rewards across
visits (the official ``robust_epoch_estimation``); no prior, no smoothing.

Deliberate differences, each named: where the official code crashes (every prompt effective and the
fallback has no candidate, B.6), the excess goes to the programme; rewards in [0, 1] enter the history
as they are (the official code maps -1 to 0; binary rewards agree). The total equals uniform's, so
Knapsack-RL saves no rollouts per step; its published gain is in what they buy ("comparable performance
with homogeneous allocation would need about 2x the computational resources", the abstract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.ada_seq import _int_at_least
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["knapsack_value", "rollouts_needed", "knapsack_allocation", "KnapsackSampler", "KnapsackConfig"]


def knapsack_value(N, p):
    """value(N, p) = (1 - p^N - (1 - p)^N) p (1 - p)^2: the chance a group of N is mixed times the
    paper's information gain p (1 - p)^2 (0 at p = 0 and p = 1)."""
    N, p = np.asarray(N, dtype=float), np.asarray(p, dtype=float)
    return (1.0 - p ** N - (1.0 - p) ** N) * p * (1.0 - p) ** 2


def rollouts_needed(p: float, alpha: float = 0.9) -> float:
    """The official fallback's estimate of the rollouts a prompt needs: the N at which the majority
    outcome's all-same probability falls to 1 - alpha, log(1 - alpha) / log(max(p, 1 - p))
    (``inf`` at p = 0, 0 at p = 1)."""
    if p <= 0.0:
        return math.inf
    if p >= 1.0:
        return 0.0
    return math.log(1.0 - alpha) / math.log(max(p, 1.0 - p))


def _split_evenly(alloc: np.ndarray, idx: Sequence[int], amount: int) -> None:
    """Add ``amount`` to ``alloc[idx]`` in equal integer parts, the remainder one each to the first."""
    idx = list(idx)
    if not idx or amount <= 0:
        return
    base, extra = divmod(int(amount), len(idx))
    for j, i in enumerate(idx):
        alloc[i] += base + (1 if j < extra else 0)


def _solve(p: np.ndarray, budget: int, min_n: int, max_n: int) -> np.ndarray:
    """The programme of step 4: extra rollouts k_i per effective prompt (see the module docstring)."""
    K = max_n - min_n
    m = p.size
    extras = np.zeros(m, dtype=int)
    if m == 0 or budget <= 0:
        return extras
    cap = min(budget, m * K)
    caps = np.arange(cap + 1)
    ks = np.arange(K + 1)
    src = caps[:, None] - ks[None, :]
    ok = src >= 0
    src = np.where(ok, src, 0)
    best = np.full(cap + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros((m, cap + 1), dtype=int)
    for i in range(m):
        v = np.concatenate([[0.0], knapsack_value(min_n + ks[1:], p[i])])
        cand = np.where(ok, best[src] + v[None, :], -np.inf)
        choice[i] = np.argmax(cand, axis=1)  # the first maximum: ties go to the smaller k
        best = cand[caps, choice[i]]
    reach = int(np.flatnonzero(np.isfinite(best))[-1]) if budget > cap else budget
    c = reach
    for i in range(m - 1, -1, -1):
        extras[i] = choice[i, c]
        c -= extras[i]
    return extras


def knapsack_allocation(valid: Sequence[bool], p_hat: Sequence[float], n: int = 8, min_n: int = 2,
                        max_n: int = 128, negative_n: int | None = None, positive_n: int | None = None,
                        alpha: float = 0.9, allow_fallback: bool = True, total: int | None = None) -> np.ndarray:
    """Rollouts per prompt, summing to ``total`` (default ``n`` per prompt): steps 1-4 of the module
    docstring, from each prompt's history validity and pass-rate estimate."""
    valid = np.asarray(valid, dtype=bool)
    p = np.where(valid, np.asarray(p_hat, dtype=float), 0.0)  # the official internal rate: 0 when unseen
    B = valid.size
    negative_n = min_n if negative_n is None else negative_n
    positive_n = min_n if positive_n is None else positive_n
    total = n * B if total is None else int(total)
    effective = valid & (p > 0.0) & (p < 1.0)
    alloc = np.where(~valid, n, np.where(effective, min_n, np.where(p <= 0.0, negative_n, positive_n))).astype(int)
    remaining = total - int(alloc.sum())
    if remaining < 0:
        raise ValueError(f"a total of {total} rollouts is below the floors of these {B} prompts ({int(alloc.sum())})")
    zero_rate = np.flatnonzero(p <= 0.0)  # the p = 0 prompts and the unseen ones (the official quirk)
    if not effective.any():
        if remaining > 0:
            if zero_rate.size:
                _split_evenly(alloc, zero_rate, remaining)
            else:
                alloc[:] = n
        return alloc
    eff = np.flatnonzero(effective)
    dp_budget = remaining
    if allow_fallback:
        needed = sum(int(min(max_n, rollouts_needed(float(p[i]), alpha))) for i in eff)
        if needed < remaining:
            targets = zero_rate if zero_rate.size else np.flatnonzero(~effective)
            if targets.size:  # the official code crashes without a target; the programme keeps the excess
                _split_evenly(alloc, targets, remaining - needed)
                dp_budget = needed
    extras = _solve(p[eff], dp_budget, min_n, max_n)
    alloc[eff] += extras
    _split_evenly(alloc, eff, dp_budget - int(extras.sum()))
    return alloc


class KnapsackSampler(Sampler):
    """Knapsack-RL's allocation (module docstring) of ``group_size`` x B rollouts among the selected
    prompts, from each prompt's reward history."""

    name = "knapsack"

    def __init__(self, min_n: int = 2, max_n: int = 128, negative_n: int | None = None,
                 positive_n: int | None = None, alpha: float = 0.9, allow_fallback: bool = True,
                 reward_buffer_length: int = 16, min_buffer_length: int = 8):
        self.min_n = _int_at_least("min_n", min_n, 1)
        self.max_n = _int_at_least("max_n", max_n, self.min_n)
        self.negative_n = self.min_n if negative_n is None else _int_at_least("negative_n", negative_n, 1)
        self.positive_n = self.min_n if positive_n is None else _int_at_least("positive_n", positive_n, 1)
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
        self.alpha, self.allow_fallback = float(alpha), bool(allow_fallback)
        self.reward_buffer_length = _int_at_least("reward_buffer_length", reward_buffer_length, 1)
        self.min_buffer_length = _int_at_least("min_buffer_length", min_buffer_length, 1)
        self.history: dict[int, list[list[float]]] = {}  # pool index -> rewards of each visit
        self.last: dict[str, float] = {}

    def estimate(self, index: int) -> tuple[bool, float]:
        """(valid, p_hat) of a prompt from its reward history (module docstring)."""
        visits = self.history.get(index, [])
        if sum(len(v) for v in visits) < self.min_buffer_length:
            return False, 0.0
        L = self.reward_buffer_length
        if len(visits[-1]) >= L:
            return True, float(np.mean(visits[-1]))
        recent: list[float] = []
        for v in reversed(visits):
            recent = list(v) + recent
            if len(recent) >= L:
                break
        return True, float(np.mean(recent[-L:]))

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        est = [self.estimate(i) for i in indices]
        n = knapsack_allocation([v for v, _ in est], [p for _, p in est], ctx.group_size, self.min_n, self.max_n,
                                self.negative_n, self.positive_n, self.alpha, self.allow_fallback)
        self.last = {"knapsack_n_max": int(n.max()), "knapsack_n_min": int(n.min()),
                     "knapsack_effective": float(np.mean([v and 0.0 < p < 1.0 for v, p in est]))}
        return ctx.generate(indices, [int(k) for k in n])

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        for g in groups:
            self.history.setdefault(g.index, []).append([float(r) for r in np.clip(g.rewards, 0.0, 1.0)])
            # only the latest rewards are ever read: keep the visits that hold them
            visits, kept = self.history[g.index], 0
            for j in range(len(visits) - 1, -1, -1):
                kept += len(visits[j])
                if kept >= max(self.reward_buffer_length, self.min_buffer_length):
                    del visits[:j]
                    break

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [[i, visits] for i, visits in sorted(self.history.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {int(i): [list(map(float, v)) for v in visits] for i, visits in state["history"]}


@register("knapsack")
@dataclass
class KnapsackConfig(StrategyConfig):
    """Knapsack-RL (Li et al., 2025; chapter 11): uniform selection, the step's B x n rollouts shared
    among its prompts by a knapsack over (prompt, rollouts) with value (1 - p^N - (1 - p)^N) p (1 - p)^2
    at each prompt's recent pass rate; the official code's floors, fallback and tie-breaks."""

    min_n: int = 2
    """Floor of an effective prompt (0 < p < 1), and the programme's base."""
    max_n: int = 128
    """Cap of the programme's rollouts per prompt (soft, as in the official code)."""
    negative_n: int | None = None
    """Rollouts of a prompt with p = 0 before the fallback (``None``: ``min_n``)."""
    positive_n: int | None = None
    """Rollouts of a prompt with p = 1 (``None``: ``min_n``)."""
    alpha: float = 0.9
    """The fallback's confidence: a prompt 'needs' the N at which an all-same group has chance 1 - alpha."""
    allow_fallback: bool = True
    """Give rollouts the effective prompts do not need to the unsolved and unseen ones."""
    reward_buffer_length: int = 16
    """Rewards that make a pass-rate estimate."""
    min_buffer_length: int = 8
    """Rollouts of history before a prompt enters the programme (before: ``group_size`` rollouts)."""

    def build(self) -> Curator:
        return Curator(Selector(), KnapsackSampler(self.min_n, self.max_n, self.negative_n, self.positive_n,
                                                   self.alpha, self.allow_fallback, self.reward_buffer_length,
                                                   self.min_buffer_length), name=self.name)
