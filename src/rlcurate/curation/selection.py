"""Bayesian data selection: which prompts to train on, chosen from Beta beliefs about their pass rates
(chapter 9, *Selecting data by information*).

Every prompt tau of the training pool carries a belief phi_tau ~ Beta(alpha_tau, beta_tau), prior
(1, 1), kept in a :class:`~rlcurate.stats.beliefs.BetaBeliefs`. One step of a belief selector:

1. take a candidate set of M_hat = ``candidate_factor`` * M distinct prompts (the whole pool when it
   is smaller), M = prompts per step, by one of two schemes (``candidates``):

   * ``"random"``: drawn uniformly from the pool afresh at every step with the step's generator
     ``ctx.rng``, so over as many candidates as the pool holds a prompt may be a candidate several
     times or never (about e^-1 = 37% of the pool never, for a pool much larger than M_hat);
   * ``"epoch"``: consecutive chunks of M_hat prompts of a seeded shuffle of the pool, a new shuffle
     once the rest of a pass is shorter than a chunk (which is then skipped, as a dataloader with
     ``drop_last``), so every prompt is a candidate exactly once per pass. This is MoPPS's official
     code (thu-rllab/MoPPS: verl's shuffled dataloader yields chunks of ``ts_ratio`` x B prompts and
     ``PosteriorSampler.sample_batch`` keeps B of each), and the default of ``mopps``. The INSIGHT
     paper (eq. 17) speaks of a random candidate set and released no code; ``insight`` and its two
     baselines keep ``"random"``.
2. score each candidate from its belief and keep the M best (:func:`~rlcurate.stats.beliefs.top_m`);
   ties go to the earlier candidate of the seeded draw, so a tie is a seeded uniform choice;
3. after the step, update only the trained prompts with the conjugate (discounted) rule
   alpha <- lambda alpha + (1 - lambda) alpha_0 + S,  beta <- lambda beta + (1 - lambda) beta_0 + K - S.

The four scores (higher is better):

=======================  =====================================================================
``insight``              w(phi_bar) * I(R_1..K; phi), w(m) = m (1 - m) exp(-eta (m - mu)^2)
                         (INSIGHT, Zhou et al. 2026, eq. 15-17)
``mopps``                -(phi_hat - 1/2)^2 with a Thompson draw phi_hat ~ Beta(alpha, beta)
                         (MoPPS, Qu et al. 2025)
``expected_difficulty``  -|phi_bar - 1/2|   (a baseline of the INSIGHT paper)
``inverse_evidence``     -(alpha + beta)     (least-observed first; a baseline of the INSIGHT paper)
=======================  =====================================================================

What counts as evidence (S successes of K trials) for a trained group, in this order:

* ``group.pool_successes`` / ``group.pool_size`` when a strategy set them: Reinforce-Ada's whole
  pool of rollouts of the prompt this step (more evidence than the kept group), SAGE's unhinted
  level-0 group of a rescued prompt, DRO's verifier counts when it reshaped the rewards;
* otherwise, for an unhinted group (``hint_level == 0``), its own rewards;
* a hinted group without pool statistics (SAGE-LIGHT) says nothing exact about the no-hint pass rate
  the beliefs describe, and is skipped (``hinted_evidence="skip"``, the default); with
  ``hinted_evidence="failures"`` its failures count as failed trials, S = 0 of K = its failures.

Why the second option exists (chapter 10, appendix A3): with ``"skip"`` a prompt that SAGE-LIGHT has
begun to hint keeps the belief it had at its last unhinted visit. If the hint does not rescue it,
SAGE-LIGHT keeps hinting it and the belief never moves, so a selector that chose it once chooses it
again and again: on a small pool the batch fills with the same failing, hinted prompts. A hint does not
lower a prompt's pass rate, so failing with one is evidence of failing without; counting those failures
(and not the hinted successes, which overstate the no-hint pass rate) moves the belief toward 0, where
INSIGHT's difficulty weight lets the prompt go. It biases the belief down, never up.

With ``evidence="generated"`` the beliefs instead learn from every unhinted group that
``ctx.generate`` produced this step (``ctx.generated_groups``), kept or not: the groups a DAPO filter
or a prefilter discarded are evidence too, and without them a saturated prompt that is always
discarded keeps its prior and is selected again and again. On the simulated world with initial pass
rates ~ Beta(0.3, 0.3) (3 seeds, 60 steps, B = 8, G = 8), ``insight+dapo`` reaches an
effective-prompt ratio of 0.20 with 26,880 rollouts under ``"trained"`` and 0.77 with 7,168 under
``"generated"``. When nothing is discarded the two agree exactly. The default is therefore
``"generated"``; ``"trained"`` follows the papers' wording (the selected, trained prompts) and is
kept for comparison.

A rollout is a success when its reward is >= ``success_threshold`` (1.0: MoPPS binarises graded
rewards the same way). With ``candidates="random"`` the selectors ignore the epoch order of the base
:class:`Selector` and their only state is the beliefs; with ``"epoch"`` its pass order and position
are part of the state too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rlcurate._validate import as_finite, as_int, as_probability
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.stats.beliefs import BetaBeliefs, insight_score, top_m

__all__ = ["BeliefSelector", "InsightSelector", "MoPPSSelector", "ExpectedDifficultySelector",
           "InverseEvidenceSelector", "group_evidence", "rollout_evidence", "BeliefConfig", "InsightConfig",
           "MoPPSConfig", "ExpectedDifficultyConfig", "InverseEvidenceConfig"]


HINTED_EVIDENCE = ("skip", "failures")


def group_evidence(group: Group, success_threshold: float = 1.0,
                   hinted_evidence: str = "skip") -> tuple[float, float] | None:
    """(successes S, trials K) that a trained group contributes to the belief about its prompt's
    no-hint pass rate (chapter 9); ``None`` when it contributes nothing (see the module docstring:
    a hinted group is skipped, or with ``hinted_evidence="failures"`` gives (0, its failures))."""
    if group.pool_size is not None and group.pool_successes is not None:
        return float(group.pool_successes), float(group.pool_size)
    return rollout_evidence(group.rewards, group.hint_level, success_threshold, hinted_evidence)


def rollout_evidence(rewards, hint_level: int, success_threshold: float = 1.0,
                     hinted_evidence: str = "skip") -> tuple[float, float] | None:
    """(S, K) of a group's own rollouts: (successes, rollouts) without a hint; with one, ``None``
    (``"skip"``) or (0, failures) (``"failures"``)."""
    r = np.asarray(rewards, dtype=float)
    successes = float(np.sum(r >= success_threshold))
    if hint_level > 0:
        return (0.0, float(r.size) - successes) if hinted_evidence == "failures" else None
    return successes, float(r.size)


class BeliefSelector(Selector):
    """Top-M of a seeded candidate set (random, or a chunk of a pass) by a belief score (chapter 9);
    subclasses define :meth:`scores`. See the module docstring for the rule and the evidence an update
    uses.

    Args:
        discount: lambda in (0, 1] of the belief update (1 keeps all evidence).
        alpha0, beta0: the Beta prior (1, 1).
        candidate_factor: M_hat / M, the size of the candidate set relative to the batch (16).
        success_threshold: a reward >= this counts as a success.
        evidence: ``"trained"`` (the trained groups) or ``"generated"`` (every group generated this
            step, kept or not, that counts as evidence by ``hinted_evidence``); see the module docstring.
        hinted_evidence: ``"skip"`` (a hinted group says nothing) or ``"failures"`` (its failures count
            as failed trials); see the module docstring.
        candidates: ``"random"`` (a fresh uniform draw per step) or ``"epoch"`` (chunks of a shuffled
            pass, every prompt once per pass; MoPPS's code); see the module docstring.
    """

    name = "belief"

    def __init__(self, discount: float = 1.0, alpha0: float = 1.0, beta0: float = 1.0,
                 candidate_factor: int = 16, success_threshold: float = 1.0, evidence: str = "generated",
                 candidates: str = "random", hinted_evidence: str = "skip"):
        super().__init__()
        if evidence not in ("trained", "generated"):
            raise ValueError(f"evidence must be 'trained' or 'generated', got {evidence!r}")
        if hinted_evidence not in HINTED_EVIDENCE:
            raise ValueError(f"hinted_evidence must be 'skip' or 'failures', got {hinted_evidence!r}")
        self.hinted_evidence = hinted_evidence
        if candidates not in ("random", "epoch"):
            raise ValueError(f"candidates must be 'random' or 'epoch', got {candidates!r}")
        self.evidence = evidence
        self.candidate_scheme = candidates
        if isinstance(candidate_factor, bool) or not isinstance(candidate_factor, (int, np.integer)) \
                or candidate_factor < 1:
            raise ValueError(f"candidate_factor must be an integer >= 1, got {candidate_factor!r}")
        if not 0.0 < float(discount) <= 1.0:
            raise ValueError(f"discount must lie in (0, 1], got {discount!r}")
        self.discount = float(discount)
        self.alpha0 = float(as_finite(alpha0, "alpha0", positive=True))
        self.beta0 = float(as_finite(beta0, "beta0", positive=True))
        self.candidate_factor = int(candidate_factor)
        self.success_threshold = float(success_threshold)
        self.beliefs: BetaBeliefs | None = None
        # what the last selection saw (for notebooks and tests)
        self.last_candidates: np.ndarray = np.zeros(0, dtype=np.int64)
        self.last_scores: np.ndarray = np.zeros(0)
        self._taken: set[int] = set()  # prompts chosen so far this step

    def bind(self, n_items: int, seed: int) -> None:
        super().bind(n_items, seed)
        self.beliefs = BetaBeliefs(n_items, self.alpha0, self.beta0, self.discount)

    # ------------------------------------------------------------------ the rule
    def scores(self, ctx: StepContext, candidates: np.ndarray) -> np.ndarray:
        """One score per candidate; the M highest are selected."""
        raise NotImplementedError

    def candidates(self, ctx: StepContext, k: int, exclude: set[int] | None = None) -> np.ndarray:
        """M_hat = ``candidate_factor * k`` distinct pool indices drawn uniformly with ``ctx.rng``
        (all remaining prompts, in a seeded random order, when the pool is smaller), or with
        ``candidates="epoch"`` the next chunk of the pass (:meth:`epoch_chunk`)."""
        if self.candidate_scheme == "epoch":
            return self.epoch_chunk(self.candidate_factor * k, k, exclude)
        pool = np.arange(self.n_items)
        if exclude:
            pool = np.setdiff1d(pool, np.fromiter(exclude, dtype=np.int64))
        size = min(self.candidate_factor * k, pool.size)
        return ctx.rng.choice(pool, size=size, replace=False).astype(np.int64)

    def epoch_chunk(self, size: int, k: int, exclude: set[int] | None = None) -> np.ndarray:
        """The next ``min(size, pool)`` prompts of the seeded pass order (base :class:`Selector`'s epoch
        state), starting a new pass when the rest of this one is shorter than a chunk. Prompts in
        ``exclude`` (taken earlier in the step) are left out, and further chunks are appended until at
        least ``k`` remain or the pool is used up; if the chunks still hold fewer than ``k`` (the untaken
        prompts sat in tails the pass skipped), every untaken prompt not seen is added, in pass order."""
        size = min(size, self.n_items)
        seen = set(exclude or ())
        out: list[int] = []
        for _ in range(self.n_items // size + 2):
            if self._order is None:
                self._order = self._epoch_order()
            if self.cursor + size > self.n_items:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._epoch_order()
            chunk = self._order[self.cursor:self.cursor + size]
            self.cursor += size
            out.extend(int(i) for i in chunk if int(i) not in seen)
            seen.update(int(i) for i in chunk)
            if len(out) >= k or len(seen) >= self.n_items:
                break
        if len(out) < k:
            out.extend(int(i) for i in self._order if int(i) not in seen)
        return np.asarray(out, dtype=np.int64)

    def _pick(self, ctx: StepContext, k: int, exclude: set[int] | None = None) -> list[int]:
        if self.beliefs is None:
            raise RuntimeError("bind() the selector to the training pool before selecting")
        cand = self.candidates(ctx, k, exclude)
        if k > cand.size:
            raise ValueError(f"cannot select {k} distinct prompts from a pool of {cand.size}; "
                             f"lower prompts_per_step or use a larger pool")
        s = np.asarray(self.scores(ctx, cand), dtype=float)
        self.last_candidates, self.last_scores = cand, s
        return [int(i) for i in cand[top_m(s, k)]]

    def select(self, ctx: StepContext, k: int) -> list[int]:
        chosen = self._pick(ctx, k)
        self._taken = set(chosen)
        return chosen

    def more(self, ctx: StepContext, k: int) -> list[int]:
        """More prompts during a step (a sampler that refills its batch, e.g. DAPO): the next ``k``
        best by the same rule among prompts not yet taken this step. When fewer than ``k`` are left the
        step starts a new pass over the pool, as uniform's draw moves to its next epoch: the rest, then
        the best of the others by the rule (prompts of this step may come again)."""
        left = self.n_items - len(self._taken)
        if k <= left:
            more = self._pick(ctx, k, exclude=self._taken)
        else:
            more = self._pick(ctx, left, exclude=self._taken) if left else []
            more += self._pick(ctx, k - left, exclude=set(more))
            self._taken = set()
        self._taken.update(more)
        return more

    def take(self, indices) -> None:
        self._taken = {int(i) for i in indices}

    # ------------------------------------------------------------------ beliefs
    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        """Conjugate update of the beliefs of the prompts rolled out this step (only those)."""
        if self.evidence == "generated":
            # one update per prompt with all of its rollouts of the step that count as evidence
            counts: dict[int, list[float]] = {}
            for g in getattr(ctx, "generated_groups", []):
                if not g.size:
                    continue
                ev = rollout_evidence(g.rewards, g.hint_level, self.success_threshold, self.hinted_evidence)
                if ev is not None:
                    c = counts.setdefault(int(g.index), [0.0, 0.0])
                    c[0] += ev[0]
                    c[1] += ev[1]
            for i, (S, K) in counts.items():
                if K > 0:
                    self.beliefs.update(i, S, K)
        else:
            for g in groups:
                ev = group_evidence(g, self.success_threshold, self.hinted_evidence)
                if ev is None or ev[1] <= 0:
                    continue
                self.beliefs.update(g.index, ev[0], ev[1])
        self._taken = set()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "beliefs": self.beliefs.state_dict() if self.beliefs else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("beliefs") is not None:
            if self.beliefs is None:
                raise RuntimeError("bind() the selector before loading its state")
            self.beliefs.load_state_dict(state["beliefs"])


class InsightSelector(BeliefSelector):
    """INSIGHT (Zhou et al., 2026; chapter 9): score A = w(phi_bar) * I(R_1..K; phi) with
    w(m) = m (1 - m) exp(-eta (m - mu)^2), K rollouts per prompt (default: the group size).

    Defaults from the paper's appendix D: eta = 3, lambda = 1, M_hat = 16 M; mu = 0.3 (the appendix
    prints 3.0, which its own sweep over {0.1, 0.3, 0.7} contradicts; 0.3 is the sweep's best).
    """

    name = "insight"

    def __init__(self, eta: float = 3.0, mu: float = 0.3, K: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.eta = float(as_finite(eta, "eta", nonnegative=True))
        self.mu = float(as_finite(mu, "mu"))  # any centre: chapter 9 also runs the appendix's printed 3.0
        self.K = None if K is None else as_int(K, "K", minimum=1)

    def scores(self, ctx, candidates):
        K = self.K if self.K is not None else int(ctx.group_size)
        b = self.beliefs
        return np.atleast_1d(insight_score(b.alpha[candidates], b.beta[candidates], K, self.eta, self.mu))


class MoPPSSelector(BeliefSelector):
    """MoPPS (Qu et al., 2025; chapter 9): a Thompson draw phi_hat ~ Beta(alpha, beta) per candidate,
    keep the M draws closest to ``target`` = 1/2. Defaults of its math scripts: M_hat = 16 M,
    lambda = 1 (its Countdown runs use lambda = 0.5 and 8 M); candidates in chunks of a shuffled pass
    (``candidates="epoch"``, its code).

    Not offered: the ``threshold`` strategy (keep draws in [0.3, 0.7]; used by one of its scripts), and
    the initialisation of the beliefs from an offline pass (``bandit_init``: alpha = 3 S + 1,
    beta = 3 F + 1 from per-prompt results on disk), because the selectors are bound to pool positions
    before any prompt is seen and the published MoPPS runs (the ``*_topk_noinit`` scripts its README
    launches) start from the prior; an offline pass over the pool is what ``prefilter``'s audit does."""

    name = "mopps"

    def __init__(self, target: float = 0.5, **kwargs):
        kwargs.setdefault("candidates", "epoch")
        super().__init__(**kwargs)
        self.target = float(as_probability(target, "target"))

    def scores(self, ctx, candidates):
        draws = self.beliefs.sample(ctx.rng, candidates)
        return -((draws - self.target) ** 2)


class ExpectedDifficultySelector(BeliefSelector):
    """Expected difficulty (a baseline of INSIGHT, chapter 9): the M candidates whose posterior mean
    is closest to 1/2, score -|phi_bar - 1/2|."""

    name = "expected_difficulty"

    def scores(self, ctx, candidates):
        return -np.abs(self.beliefs.mean[candidates] - 0.5)


class InverseEvidenceSelector(BeliefSelector):
    """Inverse evidence (a baseline of INSIGHT, chapter 9): the M least-observed candidates,
    score -(alpha + beta)."""

    name = "inverse_evidence"

    def scores(self, ctx, candidates):
        return -self.beliefs.evidence[candidates]


# ====================================================================================== registered names
@dataclass
class BeliefConfig(StrategyConfig):
    """The options every belief selector takes (chapter 9); ``group_size`` rollouts per prompt."""

    discount: float = 1.0
    """lambda in (0, 1] of the belief update (1 keeps all evidence)."""
    candidate_factor: int = 16
    """M_hat / M, the size of the candidate set relative to the prompts per step."""
    alpha0: float = 1.0
    """alpha of the Beta prior."""
    beta0: float = 1.0
    """beta of the Beta prior."""
    success_threshold: float = 1.0
    """A reward >= this counts as a success."""
    evidence: str = "generated"
    """What updates the beliefs: ``"generated"`` (every group generated this step, kept or not, that
    counts as evidence by ``hinted_evidence``) or ``"trained"`` (the trained groups)."""
    candidates: str = "random"
    """``"random"`` (a fresh uniform draw per step) or ``"epoch"`` (chunks of a shuffled pass, every
    prompt once per pass; MoPPS's code)."""
    hinted_evidence: str = "skip"
    """What a hinted group (SAGE-LIGHT) tells the beliefs: ``"skip"`` (nothing) or ``"failures"`` (its
    failures, as failed trials; breaks the loop in which a hinted prompt that keeps failing is chosen
    at every step, appendix A3)."""

    def selector(self) -> BeliefSelector:
        raise NotImplementedError

    def _belief_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(BeliefConfig)}

    def build(self) -> Curator:
        return Curator(self.selector(), Sampler(), name=self.name)


@register("insight")
@dataclass
class InsightConfig(BeliefConfig):
    """INSIGHT selection (Zhou et al., 2026; chapter 9): top-M of w(phi_bar) I(R_1..K; phi) over 16 M
    random candidates (a fresh draw per step, the paper's wording; ``candidates="epoch"`` for chunks of
    a shuffled pass); ``group_size`` rollouts each. K defaults to the group size; mu = 0.3 (the paper
    prints 3.0, a typo by its own sweep)."""

    eta: float = 3.0
    """eta of the difficulty weight w(m) = m (1 - m) exp(-eta (m - mu)^2) (the paper's 3)."""
    mu: float = 0.3
    """mu of the difficulty weight (the best of the paper's sweep; its appendix prints 3.0)."""
    K: int | None = None
    """Rollouts K of the mutual information I(R_1..K; phi) (``None``: the group size)."""

    def selector(self) -> BeliefSelector:
        return InsightSelector(eta=self.eta, mu=self.mu, K=self.K, **self._belief_kwargs())


@register("mopps")
@dataclass
class MoPPSConfig(BeliefConfig):
    """MoPPS selection (Qu et al., 2025; chapter 9): Thompson draws, the M closest to 1/2 of each
    chunk of 16 M candidates of a shuffled pass (its code; ``candidates="random"`` for a fresh draw
    per step, this library's default before issue #13)."""

    candidates: str = "epoch"
    """``"epoch"`` (chunks of a shuffled pass, every prompt once per pass; MoPPS's code) or
    ``"random"`` (a fresh uniform draw per step)."""
    target: float = 0.5
    """The pass rate the Thompson draws should be closest to."""

    def selector(self) -> BeliefSelector:
        return MoPPSSelector(target=self.target, **self._belief_kwargs())


@register("expected_difficulty")
@dataclass
class ExpectedDifficultyConfig(BeliefConfig):
    """Expected-difficulty selection (baseline of INSIGHT; chapter 9): smallest |phi_bar - 1/2|."""

    def selector(self) -> BeliefSelector:
        return ExpectedDifficultySelector(**self._belief_kwargs())


@register("inverse_evidence")
@dataclass
class InverseEvidenceConfig(BeliefConfig):
    """Inverse-evidence selection (baseline of INSIGHT; chapter 9): smallest alpha + beta."""

    def selector(self) -> BeliefSelector:
        return InverseEvidenceSelector(**self._belief_kwargs())
