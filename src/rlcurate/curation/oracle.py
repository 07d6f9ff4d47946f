"""Oracle arms: the ceiling of curation, the value of perfect information (chapter 11, *When does
curation pay?*).

A practical strategy spends rollouts to learn which prompts carry signal (a pilot, a Beta belief, a
prefilter) and then acts on what it learnt. An oracle arm acts on each training prompt's *current*
pass rate p_i, known for free (:meth:`rlcurate.curation.base.StepContext.oracle_pass_rates`: exact in
the simulated world; on a language model a periodic audit of the pool whose rollouts are not charged).
Read at equal charged rollouts, the oracle's gain over uniform GRPO is what one good rule does with exact
pass rates: a benchmark, and a lower bound on the value of perfect information (a better rule could do
more with the same p), which the chapter calls the ceiling for short. A practical strategy's gap to it is
what estimating p costs it, with that rule.

* ``oracle_select`` picks, every step, the B prompts of the pool whose groups carry the largest
  expected signal

      s(p, G) = w_G(p) * sqrt(p (1 - p)),

  where w_G(p) is the exact weight GRPO's standardised advantage puts on grad p at group size G
  (:func:`rlcurate.stats.objectives.grpo_effective_weight`, chapter 2). The expected GRPO update of a
  prompt is w_G(p) grad p, and |grad p| = |Cov(r, grad log pi)| <= sqrt(p (1 - p)) * (score norm), so s
  is the bound on the size of the prompt's expected update with the score norm taken equal across
  prompts (a language model gives no cheap score norm). Neither holds exactly: in the simulated world
  the score norms differ a hundredfold across prompts and the bound's slack varies, but s ranks the
  prompts by their true expected update almost as that does (chapter 11 measures it). It
  vanishes at p = 0 and p = 1 and, unlike the gate u(p, G) = 1 - p^G - (1 - p)^G, it accounts for how
  strongly a mixed group pushes, which the gate does not (a group with one success in eight opens the
  gate as fully as four in eight).
* ``oracle_alloc`` keeps uniform selection and splits the step's B * G rollouts among the selected
  prompts by chapter 3's variance-optimal rule from their true p, n_i proportional to
  f'(p_i) sqrt(p_i (1 - p_i)) (:func:`rlcurate.stats.allocation.optimal_allocation`), at least
  ``n_min`` = 2 each (one rollout has no group-relative advantage). The default objective is the
  linear one, the mean pass rate that held-out accuracy measures. Audited pass rates enter the rule as
  shares k / runs, or Beta(1, 1)-smoothed with ``smoothed=True`` (chapter 3 finds the share from a few runs
  makes the rule noisier than uniform).

On a language model the pool is audited every ``refresh`` steps with ``runs`` uncharged rollouts per
prompt; between audits the estimates go stale. Both the audit's rollouts (``curation/oracle_rollouts``)
and how far the estimates moved between audits (``curation/oracle_drift``, the mean absolute change,
which includes the audit's own sampling noise) are logged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.stats.allocation import optimal_allocation
from rlcurate.stats.objectives import get_objective, grpo_effective_weight, smooth_pass_rate

__all__ = ["OracleEstimates", "OracleSelector", "OracleAllocationSampler", "expected_signal"]


def expected_signal(p, G: int) -> np.ndarray:
    """s(p, G) = w_G(p) sqrt(p (1 - p)): the size of a prompt's expected GRPO update at group size G per
    unit score norm (see the module docstring; chapter 11)."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    return grpo_effective_weight(p, int(G), ddof=1) * np.sqrt(p * (1.0 - p))


class OracleEstimates:
    """Pass rates of the whole pool from :meth:`StepContext.oracle_pass_rates`, refreshed every
    ``refresh`` steps (every step where the context knows them exactly and ``exact`` is asked for). With
    ``exact=False`` the simulated world too estimates them from ``runs`` uncharged rollouts per prompt:
    free information of a known precision, between the exact oracle and a practical estimate."""

    def __init__(self, refresh: int = 5, runs: int = 8, exact: bool = True):
        for name, v in (("refresh", refresh), ("runs", runs)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.refresh, self.runs, self.exact = int(refresh), int(runs), bool(exact)
        self.p: np.ndarray | None = None
        self.audited_at = -1
        self.drift = 0.0
        self.rollouts = 0

    def current(self, ctx: StepContext) -> np.ndarray:
        before = ctx.counters.uncharged_rollouts
        free_and_exact = self.exact and ctx.knows_pass_rates
        if self.p is None or ctx.step - self.audited_at >= self.refresh or free_and_exact:
            p = ctx.oracle_pass_rates(range(len(ctx.problems)), self.runs, self.exact)
            if self.p is not None:
                self.drift = float(np.nanmean(np.abs(p - self.p)))
            self.p, self.audited_at = p, ctx.step
        self.rollouts = ctx.counters.uncharged_rollouts - before
        return self.p

    def metrics(self) -> dict[str, float]:
        return {"oracle_rollouts": self.rollouts, "oracle_drift": self.drift}

    def state_dict(self):
        return {"p": None if self.p is None else self.p.tolist(), "audited_at": self.audited_at, "drift": self.drift}

    def load_state_dict(self, state) -> None:
        self.p = None if state["p"] is None else np.array(state["p"], dtype=float)
        self.audited_at, self.drift = int(state["audited_at"]), float(state["drift"])


class OracleSelector(Selector):
    """The B prompts of largest expected signal s(p, G) under the true pass rates (ties broken by
    ``ctx.rng``), each prompt at most once between two audits; see the module docstring.

    Between audits the estimates do not move, so without that rule the same B prompts would be chosen at
    every step until the next audit, trained again and again on what the audit saw before the first of
    those steps; with it, the steps between two audits take the prompts in order of their audited signal
    (where the pass rates are exact and free, every step is an audit and the rule never binds)."""

    name = "oracle_select"
    uses_oracle = True
    needs_trainer = "it reads every prompt's pass rate from audits the trainer runs (or the simulated world's exact ones)"

    def __init__(self, refresh: int = 5, runs: int = 8, exact: bool = True):
        super().__init__()
        self.oracle = OracleEstimates(refresh, runs, exact)
        self.last_signal = 0.0
        self.since_audit: set[int] = set()  # prompts chosen since the last audit

    def select(self, ctx: StepContext, k: int) -> list[int]:
        p = self.oracle.current(ctx)
        if self.oracle.audited_at == ctx.step:
            self.since_audit = set()
        s = np.nan_to_num(expected_signal(np.nan_to_num(p, nan=0.0), ctx.group_size), nan=0.0)
        order = np.lexsort((ctx.rng.random(s.size), -s))  # largest signal first, random among equals
        fresh = [int(i) for i in order if int(i) not in self.since_audit]
        if len(fresh) < k:  # the pool is used up before the next audit: start over
            self.since_audit, fresh = set(), [int(i) for i in order]
        chosen = fresh[:k]
        self.since_audit.update(chosen)
        self.last_signal = float(s[chosen].mean()) if chosen else 0.0
        return chosen

    def metrics(self) -> dict[str, float]:
        return {**self.oracle.metrics(), "oracle_signal": self.last_signal}

    def state_dict(self):
        return {**super().state_dict(), "oracle": self.oracle.state_dict(), "since_audit": sorted(self.since_audit)}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.oracle.load_state_dict(state["oracle"])
        self.since_audit = set(state["since_audit"])


class OracleAllocationSampler(Sampler):
    """B * ``per_prompt`` rollouts split among the selected prompts by the variance-optimal rule from
    their true pass rates, at least ``n_min`` each (see the module docstring); with ``smoothed``, audited
    rates enter the rule Beta(1, 1)-smoothed."""

    name = "oracle_alloc"
    uses_oracle = True

    def __init__(self, objective: str = "linear", n_min: int = 2, per_prompt: int | None = None,
                 refresh: int = 5, runs: int = 8, exact: bool = True, smoothed: bool = False):
        get_objective(objective)  # a ValueError naming the objective
        if isinstance(n_min, bool) or not isinstance(n_min, (int, np.integer)) or n_min < 1:
            raise ValueError(f"n_min must be an integer >= 1, got {n_min!r}")
        if per_prompt is not None and (isinstance(per_prompt, bool) or not isinstance(per_prompt, (int, np.integer))
                                       or per_prompt < n_min):
            raise ValueError(f"per_prompt must be an integer >= n_min ({n_min}) or None, got {per_prompt!r}")
        self.objective, self.n_min = objective, int(n_min)
        self.per_prompt = None if per_prompt is None else int(per_prompt)
        self.oracle = OracleEstimates(refresh, runs, exact)
        self.smoothed = bool(smoothed)
        self.last: dict = {}

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        per = ctx.group_size if self.per_prompt is None else self.per_prompt
        if per < self.n_min:
            raise ValueError(f"the rollouts per prompt ({per}) are fewer than n_min ({self.n_min})")
        p = self.oracle.current(ctx)[indices]
        unaudited = np.isnan(p)  # a prompt the audit got no completion for: allocated as if p were 0.5
        p = np.where(unaudited, 0.0, p)
        if self.smoothed and not (self.oracle.exact and ctx.knows_pass_rates):  # shares of `runs` audit rollouts
            p = smooth_pass_rate(np.rint(p * self.oracle.runs), self.oracle.runs)
        p = np.where(unaudited, 0.5, p)
        n = optimal_allocation(p, per * len(indices), self.objective, n_min=self.n_min)
        self.last = {"max": int(n.max()), "min": int(n.min())}
        return ctx.generate(indices, [int(k) for k in n])

    def metrics(self) -> dict[str, float]:
        return {**self.oracle.metrics(), "oracle_n_max": self.last.get("max", 0), "oracle_n_min": self.last.get("min", 0)}

    def state_dict(self):
        return {"oracle": self.oracle.state_dict()}

    def load_state_dict(self, state) -> None:
        self.oracle.load_state_dict(state["oracle"])


@dataclass
class OracleConfig(StrategyConfig):
    """Options the oracle arms share."""

    refresh: int = 5
    """On a language model: audit the pool every ``refresh`` steps (the estimates are stale between)."""
    runs: int = 8
    """On a language model: uncharged rollouts per prompt in each audit."""
    exact: bool = True
    """``False``: estimate the pass rates from ``runs`` uncharged rollouts in the simulated world too (free
    but noisy information, refreshed every ``refresh`` steps)."""


@register("oracle_select")
@dataclass
class OracleSelectConfig(OracleConfig):
    """Oracle selection (chapter 11, a ceiling, not a practical strategy): every step the B prompts with
    the largest expected GRPO signal w_G(p) sqrt(p (1 - p)) under their true pass rates (exact in the
    simulated world; on a language model an uncharged audit of the pool every ``refresh`` steps)."""

    def build(self) -> Curator:
        return Curator(OracleSelector(self.refresh, self.runs, self.exact), Sampler(), name=self.name)


@register("oracle_alloc")
@dataclass
class OracleAllocConfig(OracleConfig):
    """Oracle allocation (chapter 11, a ceiling): uniform selection, the step's rollouts split by chapter
    3's variance-optimal rule n_i ~ f'(p_i) sqrt(p_i (1 - p_i)) from the true pass rates, at least
    ``n_min`` each."""

    objective: str = "linear"
    """The objective f whose gradient's variance is minimised (``linear``: the mean pass rate)."""
    n_min: int = 2
    """Rollouts every selected prompt gets at least (one has no group-relative advantage)."""
    smoothed: bool = False
    """Where the pass rates are audited (a language model, or ``exact=False``): allocate from the Beta(1, 1)-smoothed
    (k + 1) / (runs + 2) of each audit instead of its share k / runs, which starves the prompts whose runs all agree
    (chapter 3, *On the models*: the plug-in from 8 runs made the rule noisier than uniform on the tiny model's main
    pool). Chapter 11's runs used the share."""

    def build(self) -> Curator:
        return Curator(Selector(), OracleAllocationSampler(self.objective, self.n_min, None, self.refresh, self.runs,
                                                           self.exact, self.smoothed), name=self.name)
