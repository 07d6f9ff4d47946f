"""GVM: gradient-variance-minimising allocation (Yao et al., 2025), chapter 3, *Allocating rollouts*.

Each step has two stages (the paper's E-step and allocation, run online at every step here):

1. *Pilot*: N' rollouts per selected prompt (``pilot``; the paper uses 8, here 4 by default). From
   them p_i = accepted / N' and G_i = the mean gradient norm of the *accepted* pilot responses,
   ||grad_{embed_tokens} (-sum_t log pi(y_t | x, y_<t))||_2 (:func:`rlcurate.policy.scoring.grad_norms`, through
   ``ctx.grad_norms``; the simulated world supplies its exact score norms).
2. *Allocation*: n_i proportional to s_i = G_i / sqrt(p_i + alpha / p_i^(beta - 1)) with
   alpha = 1e-3, beta = 2 (:func:`rlcurate.stats.gvm_allocation`), rounded to integers that sum to the
   budget N = ``budget_per_prompt`` x B (default ``group_size`` x B, as the paper's N = 8 x #prompts).

Prompts with p_i = 0 (no accepted pilot response) get s_i = 0 and no allocation: the hardest prompts,
whose signal is most valuable, are starved (the weakness chapter 3 discusses and Reinforce-Ada points
out). ``min_per_prompt`` = m gives every prompt m rollouts first and allocates the rest by the rule.

Whether pilot rollouts are trained: the GVM code uses the pilot only to estimate p_i and G_i and
trains on the allocated rollouts (``train_pilot=False``). By default here (``train_pilot=True``)
the pilot is merged with the allocation into the prompt's training group: the pilot is sampled from
the current policy, so it is on-policy data already paid for. Either way the step generates
(``pilot`` + ``budget_per_prompt``) x B rollouts and all of them count as compute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from rlcurate._validate import as_finite, as_probability
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.stats.allocation import gvm_allocation, round_preserving_sum

__all__ = ["GvmSampler", "GvmConfig"]

log = logging.getLogger(__name__)


class GvmSampler(Sampler):
    """GVM's pilot-then-allocate sampler (see the module docstring).

    Args:
        pilot: N', pilot rollouts per prompt (paper 8; default 4 here).
        budget_per_prompt: mean allocated rollouts per prompt, N / B (default ``group_size``).
        alpha, beta: GVM's s_i = G_i / sqrt(p_i + alpha / p_i^(beta - 1)) (code: 1e-3 and 2).
        min_per_prompt: allocated rollouts every prompt gets before the rule shares out the rest
            (0, GVM's behaviour: prompts with p_i = 0 get nothing).
        train_pilot: merge the pilot into the training group (default) or train on the allocation only.
        positive_threshold: a response is accepted iff its reward exceeds it.
        filter_threshold, filter_insufficient: the GVM code's filters (0: off, its defaults; see
            :func:`rlcurate.stats.gvm_allocation`).

    Not offered: GVM's offline EM schedule (estimate once per iteration over the whole dataset, then an
    epoch of training with each prompt repeated n_i times), since the estimates here are taken online
    at every step from the pilot; and its RAFT++ loss (``policy_loss=plusplus``), a loss, not curation.
    """

    name = "gvm"

    def __init__(self, pilot: int = 4, budget_per_prompt: int | None = None, alpha: float = 1e-3, beta: float = 2.0,
                 min_per_prompt: int = 0, train_pilot: bool = True, positive_threshold: float = 0.7,
                 filter_threshold: float = 0.0, filter_insufficient: float = 0.0):
        for name, v, lo in (("pilot", pilot, 1), ("min_per_prompt", min_per_prompt, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if budget_per_prompt is not None and (isinstance(budget_per_prompt, bool) or
                                              not isinstance(budget_per_prompt, (int, np.integer)) or
                                              budget_per_prompt < 0):
            raise ValueError(f"budget_per_prompt must be an integer >= 0 or None, got {budget_per_prompt!r}")
        if budget_per_prompt is not None and min_per_prompt > budget_per_prompt:
            raise ValueError(f"min_per_prompt ({min_per_prompt}) exceeds budget_per_prompt ({budget_per_prompt})")
        self.pilot = int(pilot)
        self.budget_per_prompt = None if budget_per_prompt is None else int(budget_per_prompt)
        self.alpha = float(as_finite(alpha, "alpha", nonnegative=True))
        self.beta = float(beta)
        self.min_per_prompt = int(min_per_prompt)
        self.train_pilot = bool(train_pilot)
        self.positive_threshold = float(positive_threshold)
        self.filter_threshold = float(as_probability(filter_threshold, "filter_threshold"))
        self.filter_insufficient = float(as_probability(filter_insufficient, "filter_insufficient"))
        self.last: dict = {}
        self._warned = False

    def estimates(self, ctx: StepContext, pilot: list[Group]) -> tuple[np.ndarray, np.ndarray]:
        """(p_i, G_i) from the pilot groups: accepted share and mean gradient norm of the accepted."""
        p = np.zeros(len(pilot))
        G = np.zeros(len(pilot))
        for k, g in enumerate(pilot):
            acc = np.flatnonzero(g.rewards > self.positive_threshold)
            p[k] = acc.size / g.size if g.size else 0.0
            if acc.size == 0:
                continue
            if ctx.grad_norms is None:
                if not self._warned:
                    log.warning("gvm: the context has no grad_norms; using G_i = 1 (the p-only rule)")
                    self._warned = True
                G[k] = 1.0
            else:
                G[k] = float(np.mean(ctx.grad_norms(g.subset(acc.tolist()))))
        return p, G

    def _filters_keep_some(self, p: np.ndarray, G: np.ndarray, budget: int) -> bool:
        try:
            gvm_allocation(p, G, budget, self.alpha, self.beta, self.filter_threshold, self.filter_insufficient)
        except ValueError:
            return False
        return True

    def metrics(self) -> dict[str, float]:
        return {"gvm_starved": self.last.get("starved", 0)}

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        B = len(indices)
        per = ctx.group_size if self.budget_per_prompt is None else self.budget_per_prompt
        if self.min_per_prompt > per:
            raise ValueError(f"min_per_prompt ({self.min_per_prompt}) exceeds the budget per prompt ({per})")
        pilot = ctx.generate(indices, self.pilot)
        p, G = self.estimates(ctx, pilot)
        rest = (per - self.min_per_prompt) * B
        s_ok = (p > 0) & (G > 0)
        if rest == 0:
            alloc = np.zeros(B, dtype=np.int64)
        elif s_ok.any() and self._filters_keep_some(p, G, rest):
            alloc = gvm_allocation(p, G, rest, self.alpha, self.beta, self.filter_threshold, self.filter_insufficient)
        else:  # no prompt has an accepted pilot response (or none passes the filters): share evenly
            log.info("gvm: no prompt of step %d has a usable pilot estimate; allocating evenly", ctx.step)
            alloc = round_preserving_sum(np.full(B, rest / B), rest)
        n = self.min_per_prompt + alloc
        extra = ctx.generate(indices, [int(k) for k in n])
        groups = [a.merge(b) for a, b in zip(pilot, extra)] if self.train_pilot else extra
        if not self.train_pilot:  # the pilot's compute still counts
            for a, g in zip(pilot, groups):
                g.generated += a.generated
                g.generated_tokens += a.generated_tokens
        self.last = {"p": p.tolist(), "G": G.tolist(), "n": [int(k) for k in n],
                     "starved": int(np.sum(n == 0))}
        return groups


@register("gvm")
@dataclass
class GvmConfig(StrategyConfig):
    """GVM (Yao et al., 2025; chapter 3): a pilot of ``pilot`` rollouts per prompt estimates p_i and
    the gradient norm G_i; ``budget_per_prompt`` x B more rollouts are allocated proportionally to
    G_i / sqrt(p_i + alpha / p_i^(beta - 1)); prompts with p_i = 0 get none unless ``min_per_prompt``;
    the code's ``filter_threshold`` and ``filter_insufficient`` (0: off)."""

    pilot: int = 4
    """N', pilot rollouts per prompt (the paper uses 8)."""
    budget_per_prompt: int | None = None
    """Mean allocated rollouts per prompt, N / B (``None``: ``group_size``)."""
    alpha: float = 1e-3
    """alpha of s_i = G_i / sqrt(p_i + alpha / p_i^(beta - 1)) (the code's 1e-3)."""
    beta: float = 2.0
    """beta of the same rule (the code's 2)."""
    min_per_prompt: int = 0
    """Allocated rollouts every prompt gets before the rule shares out the rest (0, GVM's behaviour:
    prompts with p_i = 0 get nothing)."""
    train_pilot: bool = True
    """Merge the pilot into the training group (``False``: train on the allocation only, as the GVM
    code; the pilot's rollouts count as compute either way)."""
    positive_threshold: float = 0.7
    """A response is accepted iff its reward exceeds this."""
    filter_threshold: float = 0.0
    """The GVM code's first filter: > 0 drops prompts whose p_i exceeds it (0: off; its run script
    passes 1.0, which keeps all; :func:`rlcurate.stats.gvm_allocation`)."""
    filter_insufficient: float = 0.0
    """The GVM code's second filter: > 0 drops prompts whose expected accepted responses fall below it
    (0: off)."""

    def build(self) -> Curator:
        return Curator(Selector(), GvmSampler(self.pilot, self.budget_per_prompt, self.alpha, self.beta,
                                              self.min_per_prompt, self.train_pilot, self.positive_threshold,
                                              self.filter_threshold, self.filter_insufficient), name="gvm")
