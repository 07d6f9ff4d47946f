"""DRO's query filter: prune the *dataset* every so often (Xu et al., 2025, section 4.2.2; chapter 8).

The per-step group filter of :mod:`rlcurate.curation.dro` (``filter_fraction``) drops groups that
were already generated, so it saves no rollouts. The paper's filter works on the training set
instead. At the start of training and then at every *round*, it samples N chains of thought for each
query under the current policy, estimates the query's difficulty and usefulness from them, and
removes queries; until the next round training draws only from the kept ones, so the dropped
queries cost nothing more. :class:`DroFilterSelector` is that filter as a selector, so it composes
with any sampler: ``dro_filter`` trains the kept queries with plain GRPO groups and
``dro_filter+dro`` with DRO's R3 reward or token weights.

One round, on the candidate queries (the whole training pool, or the next ``round_prompts`` of a
seeded pass over it):

1. **Estimate.** ``rollouts`` (N, default 16: "N = 16 or 32") completions of each candidate through
   ``ctx.generate``: every one of them is counted in the step's ledger (``ctx.counters``) like any
   other rollout, so equal-compute comparisons charge the filter. They are not trained on.
2. **Too hard** (``rank_fraction`` rho, ``rank_top_k`` k). With ``signal="reference"`` (the paper's),
   the reference answer y is teacher-forced after each CoT's reasoning, as for R3
   (:func:`rlcurate.curation.dro.reference_contexts`), giving the rank of every reference token
   under the policy (1: the most likely token). A CoT's score is the mean rank of its
   ``ceil(rho * |y|)`` worst-ranked reference tokens (at least one); the query is too hard, and
   removed, when no CoT scores <= k.
3. **Low variation** (``drop_fraction``). Each remaining query is scored by max_j sigma_j, sigma_j
   the standard deviation (ddof 0) over the N CoTs of log pi(y_j | q, c_i, y_<j); the
   ``floor(drop_fraction * n)`` lowest of the n remaining are removed (ties: the earlier candidate
   first), so at least one remains.
4. **Carry over** (``carry_over``, default 0.1: "carry over 10 % of the previous set"). A seeded
   random ``round(carry_over * |P|)`` of the previous round's kept set P are added back to the kept
   set, whatever this round's estimate said of them.

Training then walks passes, each in a seeded random order, over the kept set, until the next round:
after each full pass over it (``every=None``, the default), or every ``every`` steps.

What the reference (algorithms.md, section 4) leaves open, and what this module chooses, the
simplest reading in each case:

* rho and k are not given: ``rank_fraction=0.1`` and ``rank_top_k=10``, choices, not the paper's.
  With rho = 10 % an answer of up to ten tokens (the book's tasks) is judged by its single
  worst-ranked token: the query is too hard when every CoT leaves some reference token outside the
  policy's top 10.
* the low-variation cutoff is "based on data size and capacity": ``drop_fraction=0.25``, the share
  the package's configs used for the per-step filter. It applies to the queries that survived step 2.
* the period of the rounds is not given: a round per pass over the kept set, as "round" suggests
  (``every`` gives a fixed number of steps instead). A round that starts in the middle of a step's
  draws waits for the next step.
* "carry over 10 % of the previous set": a uniform random draw from the previous kept set (already
  kept queries among them just stay kept) of ``carry_over * |P|`` queries rounded to the nearest
  integer (halves up); at the first round there is no previous set.
* which queries a round estimates: all of the training pool (``round_prompts=None``). A number
  estimates only that many per round, the next ones of a seeded pass over the pool, so that large
  pools do not cost N rollouts per query at every round.
* a round that would keep nothing keeps the previous set (at the first round: every candidate), with
  a warning.
* a query whose reference answer is empty cannot be scored: it is never too hard and scores 0.

``signal="reward"`` is this package's stand-in for worlds that cannot teacher-force a reference
answer (the simulated world, whose completion is a single answer token): a query is too hard when
none of its N rollouts has reward 1 (the case where no CoT reaches the reference answer), and its
variation score is the standard deviation (ddof 0) of the N rewards (sigma of a one-token answer). It
is not the paper's statistic (chapter 8 finds that, where a verifier exists, a pilot's rewards predict
a mixed group better than max_j sigma_j does).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.dro import reference_contexts
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.seeding import named_stream

__all__ = ["DroFilterSelector", "DroFilterConfig", "QueryEstimate", "FilterRound", "worst_tokens_mean_rank",
           "filter_queries", "carry_over_draw", "SIGNALS"]

log = logging.getLogger(__name__)

SIGNALS = ("reference", "reward")


# ------------------------------------------------------------------------------------ the rules
def worst_tokens_mean_rank(ranks: Sequence[int], rank_fraction: float) -> float:
    """The mean rank of the ``ceil(rank_fraction * J)`` (at least one) worst-ranked of a CoT's J
    reference tokens: the paper's "mean token rank of the bottom-rho % reference tokens"."""
    r = np.sort(np.asarray(ranks, dtype=float))
    if r.size == 0:
        return 1.0
    m = max(1, math.ceil(rank_fraction * r.size - 1e-9))
    return float(r[-m:].mean())


@dataclass
class QueryEstimate:
    """What one round learned about one candidate query from its N rollouts."""

    index: int  # position in the training pool
    too_hard: bool  # no CoT within the top k (signal "reference") / no rollout right (signal "reward")
    score: float  # max_j sigma_j (signal "reference") / std of the rewards (signal "reward")
    best_rank: float | None = None  # min over CoTs of worst_tokens_mean_rank (signal "reference")


def filter_queries(estimates: Sequence[QueryEstimate], drop_fraction: float) -> tuple[list[int], list[int], list[int]]:
    """``(kept, too_hard, low_variation)``: pool indices of the estimated queries that survive, in
    candidate order; those removed as too hard; those removed as the ``floor(drop_fraction * n)``
    lowest scores of the n queries that are not too hard (ties: the earlier candidate first)."""
    too_hard = [e.index for e in estimates if e.too_hard]
    rest = [e for e in estimates if not e.too_hard]
    n = len(rest)
    n_drop = min(int(math.floor(drop_fraction * n + 1e-9)), max(n - 1, 0))
    low: set[int] = set()
    if n_drop > 0:
        scores = np.array([e.score for e in rest], dtype=float)
        order = np.lexsort((np.arange(n), scores))  # lowest score first, the earlier candidate on ties
        low = {int(i) for i in order[:n_drop]}
    kept = [e.index for k, e in enumerate(rest) if k not in low]
    return kept, too_hard, [rest[k].index for k in sorted(low)]


def carry_over_draw(previous: Sequence[int], fraction: float, rng: np.random.Generator) -> list[int]:
    """A uniform random ``round(fraction * |previous|)`` of the previous kept set (halves round up),
    sorted."""
    prev = sorted(int(i) for i in previous)
    m = min(int(math.floor(fraction * len(prev) + 0.5)), len(prev))
    if m <= 0:
        return []
    return sorted(int(i) for i in rng.choice(prev, size=m, replace=False))


@dataclass
class FilterRound:
    """One round of the filter: when, what it estimated, what it removed and kept."""

    step: int
    candidates: list[int]
    estimates: list[QueryEstimate]
    too_hard: list[int]
    low_variation: list[int]
    carried: list[int]
    kept: list[int]
    rollouts: int  # rollouts generated to estimate (all counted in ctx.counters)
    fallback: bool = False  # the round kept nothing and fell back (see the module docstring)
    previous: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------------ checks
def _int(name: str, v, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _fraction(name: str, v, lo: float, hi: float, hi_open: bool = False, lo_open: bool = False) -> float:
    ok = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
    if ok:
        x = float(v)
        ok = (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {v!r}")
    return float(v)


# ------------------------------------------------------------------------------------ the selector
class DroFilterSelector(Selector):
    """DRO's dataset-level query filter (see the module docstring): every round, estimate the
    candidate queries from ``rollouts`` rollouts each (counted through ``ctx.generate``), remove the
    too hard and the least varied, carry over a share of the previous kept set, and draw the steps'
    prompts in passes over the kept set.

    After a round, ``last_round`` holds its :class:`FilterRound`; ``kept`` is the current kept set.
    """

    name = "dro_filter"
    needs_trainer = ("it generates rollouts of its candidate queries and scores them with the policy's "
                     "log-probabilities before choosing")

    def __init__(self, every: int | None = None, rollouts: int = 16, drop_fraction: float = 0.25,
                 rank_fraction: float = 0.1, rank_top_k: int = 10, carry_over: float = 0.1,
                 round_prompts: int | None = None, signal: str = "reference", answer_template: str | None = None,
                 append_eos: bool = True, token_budget: int = 16384):
        super().__init__()
        self.every = None if every is None else _int("every", every, 1)
        self.rollouts = _int("rollouts", rollouts, 2)
        self.drop_fraction = _fraction("drop_fraction", drop_fraction, 0.0, 1.0, hi_open=True)
        self.rank_fraction = _fraction("rank_fraction", rank_fraction, 0.0, 1.0, lo_open=True)
        self.rank_top_k = _int("rank_top_k", rank_top_k, 1)
        self.carry_over = _fraction("carry_over", carry_over, 0.0, 1.0)
        self.round_prompts = None if round_prompts is None else _int("round_prompts", round_prompts, 1)
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {signal!r}")
        self.signal = signal
        if answer_template is not None and not isinstance(answer_template, str):
            raise ValueError(f"answer_template must be a string such as '#{{answer}}' or None, got {answer_template!r}")
        self.answer_template = answer_template
        if not isinstance(append_eos, bool):
            raise ValueError(f"append_eos must be true or false, got {append_eos!r}")
        self.append_eos = append_eos
        self.token_budget = _int("token_budget", token_budget, 1)
        self.kept: list[int] | None = None
        self.rounds = 0
        self.round_step = -1
        self.round_epoch = 0
        self.chunk_pass = 0
        self.chunk_cursor = 0
        self.estimate_rollouts = 0  # over the run
        self.last_round: FilterRound | None = None
        self._step_rollouts = 0  # this step's estimation rollouts (metrics)
        self._ran = False  # whether this step ran a round (metrics)
        self._resumed_counts = [0, 0, 0]  # the last round's counts, restored by load_state_dict

    # ------------------------------------------------------------------ a round
    def _candidates(self) -> list[int]:
        if self.round_prompts is None or self.round_prompts >= self.n_items:
            return list(range(self.n_items))
        out: list[int] = []
        while len(out) < self.round_prompts:
            order = named_stream("dro_filter_chunks", self.seed, self.chunk_pass).permutation(self.n_items)
            take = min(self.round_prompts - len(out), self.n_items - self.chunk_cursor)
            out.extend(int(i) for i in order[self.chunk_cursor:self.chunk_cursor + take])
            self.chunk_cursor += take
            if self.chunk_cursor >= self.n_items:
                self.chunk_pass, self.chunk_cursor = self.chunk_pass + 1, 0
        return out

    def estimate(self, ctx: StepContext, indices: Sequence[int]) -> tuple[list[QueryEstimate], int]:
        """Generate ``rollouts`` completions of each query (one ``ctx.generate`` call, counted) and
        estimate each with the configured signal. Returns the estimates and the rollouts generated."""
        if self.signal == "reference" and (ctx.tokenizer is None or ctx.sequence_logprobs_and_ranks is None):
            raise ValueError("dro_filter with signal='reference' needs the language-model policy and its tokenizer "
                             "(ctx.sequence_logprobs_and_ranks, ctx.tokenizer); on the simulated world use "
                             "signal='reward'")
        groups = ctx.generate(list(indices), self.rollouts)
        spent = sum(g.generated for g in groups)
        if self.signal == "reward":
            return [self._reward_estimate(g) for g in groups], spent
        return self._reference_estimates(ctx, groups), spent

    def _reward_estimate(self, g: Group) -> QueryEstimate:
        r = np.asarray(g.rewards, dtype=float)
        return QueryEstimate(int(g.index), too_hard=not bool(np.any(r >= 1.0)),
                             score=float(r.std()) if r.size else 0.0)

    def _reference_estimates(self, ctx: StepContext, groups: Sequence[Group]) -> list[QueryEstimate]:
        plans, contexts, answers, owner = reference_contexts(ctx, groups, self.answer_template, self.append_eos)
        scored = ctx.sequence_logprobs_and_ranks(contexts, answers, token_budget=self.token_budget) if contexts else []
        rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for gi, pair in zip(owner, scored):
            rows.setdefault(gi, []).append(pair)
        out = []
        for gi, (g, plan) in enumerate(zip(groups, plans)):
            if plan is None:  # nothing to score: never too hard, lowest variation
                out.append(QueryEstimate(int(g.index), too_hard=False, score=0.0))
                continue
            ell = np.stack([np.asarray(lp, dtype=float) for lp, _ in rows[gi]])
            best = min(worst_tokens_mean_rank(rk, self.rank_fraction) for _, rk in rows[gi])
            sigma = ell.std(axis=0)
            out.append(QueryEstimate(int(g.index), too_hard=best > self.rank_top_k,
                                     score=float(sigma.max()) if sigma.size else 0.0, best_rank=float(best)))
        return out

    def run_round(self, ctx: StepContext) -> FilterRound:
        """One round (see the module docstring); sets :attr:`kept` and starts a pass over it."""
        candidates = self._candidates()
        estimates, spent = self.estimate(ctx, candidates)
        survivors, too_hard, low = filter_queries(estimates, self.drop_fraction)
        previous = list(self.kept or [])
        carried = carry_over_draw(previous, self.carry_over,
                                  named_stream("dro_filter_carry", self.seed, self.rounds)) if previous else []
        kept = sorted(set(survivors) | set(carried))
        fallback = not kept
        if fallback:
            kept = previous or sorted(candidates)
            log.warning("dro_filter: the round at step %d removed every one of its %d queries (%d too hard); "
                        "keeping %s", ctx.step + 1, len(candidates), len(too_hard),
                        f"the previous {len(kept)}" if previous else f"all {len(kept)}")
        self.estimate_rollouts += spent
        self._step_rollouts += spent
        self.rounds += 1
        self.round_step = ctx.step
        self._set_kept(kept)
        rnd = FilterRound(ctx.step, list(candidates), estimates, too_hard, low, carried, list(self.kept), spent,
                          fallback, previous)
        self.last_round = rnd
        return rnd

    def _set_kept(self, kept: list[int]) -> None:
        self.kept = [int(i) for i in kept]
        if self.cursor:  # a pass was under way: the new set starts a new one
            self.epoch += 1
        self.cursor, self._order = 0, None
        self.round_epoch = self.epoch

    def due(self, ctx: StepContext) -> bool:
        """Whether a round starts at this step: at the first, then after each full pass over the kept
        set (``every=None``) or ``every`` steps after the last round."""
        if self.kept is None:
            return True
        if self.every is None:
            return self.epoch > self.round_epoch
        return ctx.step - self.round_step >= self.every

    # ------------------------------------------------------------------ selection
    def _epoch_order(self) -> np.ndarray:
        kept = np.asarray(self.kept, dtype=np.int64)
        return kept[named_stream("dro_filter_epoch", self.seed, self.epoch).permutation(kept.size)]

    def draw(self, k: int) -> list[int]:
        if self.kept is None:
            raise RuntimeError("DroFilterSelector.draw before the first select: no round has run")
        return super().draw(k)

    def select(self, ctx: StepContext, k: int) -> list[int]:
        self._step_rollouts = 0
        self._ran = self.due(ctx)
        if self._ran:
            self.run_round(ctx)
        return self.draw(k)

    # ------------------------------------------------------------------ diagnostics and state
    def _last_counts(self) -> list[int]:
        r = self.last_round
        return [len(r.too_hard), len(r.low_variation), len(r.carried)] if r else list(self._resumed_counts)

    def metrics(self) -> dict[str, float]:
        """The kept set's size, whether this step ran a round and its estimation rollouts, and what
        the last round removed (too hard, low variation) and carried over."""
        too_hard, low, carried = self._last_counts()
        return {"dro_filter_kept": len(self.kept or []), "dro_filter_round": float(self._ran),
                "dro_filter_estimate_rollouts": self._step_rollouts, "dro_filter_too_hard": too_hard,
                "dro_filter_low_variation": low, "dro_filter_carried": carried}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "kept": self.kept, "rounds": self.rounds,
                "round_step": self.round_step, "round_epoch": self.round_epoch, "chunk_pass": self.chunk_pass,
                "chunk_cursor": self.chunk_cursor, "estimate_rollouts": self.estimate_rollouts,
                "last_counts": self._last_counts()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.kept = None if state["kept"] is None else [int(i) for i in state["kept"]]
        for key in ("rounds", "round_step", "round_epoch", "chunk_pass", "chunk_cursor", "estimate_rollouts"):
            setattr(self, key, int(state[key]))
        self.last_round = None
        self._resumed_counts = [int(v) for v in state["last_counts"]]


@register("dro_filter")
@dataclass
class DroFilterConfig(StrategyConfig):
    """DRO's query filter (Xu et al., 2025, section 4.2.2; chapter 8): prune the training set, not the
    batch. At the first step and then every round, N (``rollouts``) rollouts of each candidate query,
    counted as rollouts of that step, estimate it; the queries on which no CoT ranks the reference
    answer's worst tokens within the top ``rank_top_k``, then the ``drop_fraction`` with the lowest
    max_j sigma_j, are removed, a ``carry_over`` share of the previous kept set is added back, and
    training draws only from the kept queries (``group_size`` rollouts each). Compose with DRO's uses
    as ``dro_filter+dro``; ``signal="reward"`` runs on the simulated world.

    Defaults from the reference where it gives them (N = 16, carry over 10 %); where it does not,
    the choices are listed in ``src/rlcurate/curation/dro_filter.py``."""

    every: int | None = None
    """Steps between rounds; ``None``: a new round after each full pass over the kept queries."""
    rollouts: int = 16
    """N, rollouts per candidate query to estimate it (the paper: 16 or 32); counted, not trained on."""
    drop_fraction: float = 0.25
    """Share in [0, 1) of the queries that are not too hard removed for the lowest max_j sigma_j
    (the paper's cutoff is "based on data size and capacity"; 0: no low-variation filter)."""
    rank_fraction: float = 0.1
    """rho in (0, 1]: a CoT is scored by the mean rank of its ceil(rho * |y|) worst-ranked reference
    tokens (at least one)."""
    rank_top_k: int = 10
    """k: a query is too hard when no CoT's score (above) is <= k (1: the most likely token)."""
    carry_over: float = 0.1
    """Share in [0, 1] of the previous round's kept queries added back at random (the paper: 10 %)."""
    round_prompts: int | None = None
    """Queries estimated per round, the next ones of a seeded pass over the pool (``None``: all)."""
    signal: str = "reference"
    """``"reference"``: the paper's teacher-forced reference answer (language model only);
    ``"reward"``: the rollouts' rewards (too hard: none right; score: their std), for the simulated world."""
    answer_template: str | None = None
    """The reference answer as the model writes it, e.g. ``"#{answer}"`` (``None``: the task's format)."""
    append_eos: bool = True
    """Append the end-of-sequence token to the reference answer."""
    token_budget: int = 16384
    """Tokens per micro-batch of the teacher-forced scoring pass."""

    def build(self) -> Curator:
        sel = DroFilterSelector(self.every, self.rollouts, self.drop_fraction, self.rank_fraction, self.rank_top_k,
                                self.carry_over, self.round_prompts, self.signal, self.answer_template,
                                self.append_eos, self.token_budget)
        return Curator(sel, Sampler(), name="dro_filter")
