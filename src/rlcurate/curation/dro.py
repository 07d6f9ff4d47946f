"""Token- and query-level variance of a reference answer: DRO's R3 (Xu et al., 2025; chapter 8,
*Token- and query-level variance*).

For each group of G rollouts of a prompt q, rollout i is cut into its reasoning c_i and its answer
(at the task's answer delimiter: arithmetic's ``#``, :func:`rlcurate.tasks.arithmetic.split_completion`;
a task without a ``split`` method has no delimiter and the whole completion is the reasoning). The
reference answer y (the gold answer written the way the model writes it, ``task.format_answer``,
e.g. ``"#132"``, followed by the end-of-sequence token) is teacher-forced after q + c_i with the
current policy (no gradient, temperature 1, batched):

    l_ij    = log pi(y_j | q, c_i, y_<j)                   reference token j after rollout i's reasoning
    sigma_j = std_i l_ij   (over the G rollouts, ddof 0)   how much token j depends on the reasoning
    w_j     = sigma_j^k / mean_j' sigma_j'^k               reasoning-reflective weights, mean 1
                                                           (k = ``weight_power``, 1 by default; all 1
                                                           when every sigma_j is 0)
    R3_i    = sum_j w_j l_ij

The paper leaves w_Delta(sigma) unspecified beyond "increasing in sigma"; the power-ratio form above
is this package's choice (k = 0 gives the unweighted log-likelihood of y). The paper's
anti-compensation variants and its length penalty on the final answer are not implemented: the
answers of the tasks here are a few tokens long.

Three uses, switchable (``use_as``, ``filter_fraction``):

``use_as="reward"`` (the paper's use; the default)
    r_i <- (1 - mix) r_i + mix * r3_i with the normalised r3_i = exp(R3_i / sum_j w_j), the
    weight-averaged geometric-mean probability of the reference tokens, in (0, 1]. ``reward_mix``
    = 1 (default) replaces the verifier's reward, as the paper does on tasks without a verifier.
    The verifier's counts stay available as ``pool_successes`` / ``pool_size`` for belief selectors.
``use_as="token_weights"``
    the reward is kept; ``group.token_weights[i]`` multiplies the per-token policy loss of completion
    i (see :mod:`rlcurate.train.loss`): 1 on the reasoning tokens; on the completion's own answer span
    (its tokens from the delimiter to the end, EOS included) position m gets w_m (1 past the length
    of y), then the span is rescaled to mean 1, so an answer keeps its total weight and only
    redistributes it toward the positions where the reference tokens depend on the reasoning. A
    completion without a delimiter gets weight 1 everywhere.
``use_as="both"`` both of the above; ``use_as="none"`` neither (only the per-step group filter).
``filter_fraction`` (the per-step group filter; *not* the paper's query filter)
    score each group (query) by max_j sigma_j and drop the groups whose score is among the lowest
    ``floor(filter_fraction * B)`` of the batch (ties: the earlier group is dropped first), keeping at
    least one. 0 (default) is off. **It saves no compute**: the dropped groups were already generated
    (and scored) this step, and are counted; it only changes which generated groups are trained on.
    The paper's query filter (section 4.2.2) prunes the *dataset* every so often from rollouts drawn
    for the purpose, so that later steps never sample the dropped queries: that is the selector of
    :mod:`rlcurate.curation.dro_filter` (strategy ``dro_filter``, composed with these uses as
    ``dro_filter+dro``). The option keeps its name because the book's chapter 8 and the recorded runs
    (configs/suites/dro.yaml, end_to_end.yaml) use it.

DRO needs the language-model policy (``ctx.sequence_logprobs``, ``ctx.tokenizer``): it does not run on the
simulated world.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from rlcurate._validate import as_int
from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["DROProcessor", "DROStats", "DroConfig", "reference_answer_text", "reasoning_token_count",
           "reflectivity_weights", "r3_scores", "answer_span_weights", "split_reasoning", "reference_contexts"]

USES = ("reward", "token_weights", "both", "none")

# How a task without ``format_answer`` states a final answer (the format its prompt asks for).
_ANSWER_FORMATS = {"gsm8k": "\n#### {answer}", "math": "\\boxed{{{answer}}}"}


def reference_answer_text(task, problem, template: str | None = None) -> str:
    """The reference answer y as the model would write it (chapter 8): ``template.format(answer=...)``
    if given, else ``task.format_answer(problem.answer)`` (arithmetic: ``"#132"``), else a
    task-specific format (GSM8K ``"\\n#### 132"``, MATH ``"\\boxed{132}"``), else ``" 132"``."""
    if template is not None:
        return template.format(answer=problem.answer)
    fmt = getattr(task, "format_answer", None)
    if callable(fmt):
        return fmt(problem.answer)
    name = str(getattr(task, "name", ""))
    for key, tpl in _ANSWER_FORMATS.items():
        if name.startswith(key):
            return tpl.format(answer=problem.answer)
    return " " + problem.answer


def reasoning_token_count(tokenizer, token_ids: Sequence[int], n_chars: int) -> int:
    """The largest k such that the first k tokens decode to at most ``n_chars`` characters (the
    reasoning c_i as a token prefix of the completion; chapter 8). Binary search on the decoded length."""
    lo, hi = 0, len(token_ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(list(token_ids[:mid]), skip_special_tokens=False)) <= n_chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


def reflectivity_weights(sigma, power: float = 1.0) -> np.ndarray:
    """w_j = sigma_j^k / mean_j sigma_j^k, all ones when every sigma_j is 0 (chapter 8)."""
    s = np.asarray(sigma, dtype=float)
    if s.size == 0:
        return s
    v = s**power if power != 0 else np.ones_like(s)
    m = float(v.mean())
    return v / m if m > 0 else np.ones_like(s)


def r3_scores(ell: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """R3_i = sum_j w_j l_ij for the (G, J) matrix of teacher-forced log-probs (chapter 8)."""
    return np.asarray(ell, dtype=float) @ np.asarray(weights, dtype=float)


def answer_span_weights(n_tokens: int, answer_start: int | None, weights: np.ndarray) -> np.ndarray:
    """Per-token loss weights of one completion of ``n_tokens`` tokens whose answer span starts at
    token ``answer_start`` (None: no answer): 1 on the reasoning, w_m at position m of the span (1 past
    the end of ``weights``), the span rescaled to mean 1 (chapter 8)."""
    tw = np.ones(n_tokens)
    if answer_start is None or answer_start >= n_tokens:
        return tw
    span = np.ones(n_tokens - answer_start)
    m = min(span.size, len(weights))
    span[:m] = np.asarray(weights, dtype=float)[:m]
    total = float(span.sum())
    if total > 0:
        span *= span.size / total
    else:
        span[:] = 1.0
    tw[answer_start:] = span
    return tw


def split_reasoning(task, text: str) -> tuple[str, bool]:
    """``(reasoning, has_answer)`` of a completion: the text before the task's answer delimiter
    (``task.split``) and True, or the whole text and False when the task has no ``split`` method, the
    completion has no answer, or the splitter fails on it (chapter 8)."""
    splitter = getattr(task, "split", None)
    if callable(splitter):
        try:
            reasoning, answer = splitter(text)
        except Exception:  # a task's splitter must not kill a run on model text
            return text, False
        if answer is not None and isinstance(reasoning, str) and text.startswith(reasoning):
            return reasoning, True
    return text, False


def reference_contexts(ctx: StepContext, groups: Sequence[Group], answer_template: str | None = None,
                       append_eos: bool = True):
    """What teacher-forcing the reference answer after every rollout's reasoning needs (chapter 8).

    Returns ``(plans, contexts, answers, owner)``: one plan per group, ``None`` for an empty group or
    an empty reference, else ``(k_i, answer_start_i, y_ids)`` (tokens of the reasoning c_i, first
    answer token or None, the reference answer's token ids); and, flat over the rollouts of the
    planned groups, the context (prompt + c_i), the continuation (y) and the position of its group."""
    tok = ctx.tokenizer
    eos = tok.eos_token_id
    contexts, answers, owner = [], [], []
    plans: list[tuple[list[int], list[int | None], list[int]] | None] = []
    for gi, g in enumerate(groups):
        if not g.size:
            plans.append(None)
            continue
        y_text = reference_answer_text(ctx.task, g.problem, answer_template)
        y_ids = list(tok.encode(y_text, add_special_tokens=False))
        if append_eos and eos is not None:
            y_ids.append(int(eos))
        if not y_ids:
            plans.append(None)
            continue
        ks, starts = [], []
        for c in g.completions:
            prompt_ids = list(c.prompt_token_ids) or list(tok.encode(g.prompt, add_special_tokens=False))
            ids = list(c.token_ids)
            reasoning, has_answer = split_reasoning(ctx.task, c.text)
            if has_answer:
                k = reasoning_token_count(tok, ids, len(reasoning))
                starts.append(k)
            else:
                k = len(ids) - 1 if ids and eos is not None and ids[-1] == eos else len(ids)
                starts.append(None)
            ks.append(k)
            contexts.append(prompt_ids + ids[:k])
            answers.append(y_ids)
            owner.append(gi)
        plans.append((ks, starts, y_ids))
    return plans, contexts, answers, owner


@dataclass
class DROStats:
    """What DRO computed for one group (chapter 8)."""

    ell: np.ndarray  # (G, J) teacher-forced log-probs of the reference tokens
    sigma: np.ndarray  # (J,) std over rollouts
    weights: np.ndarray  # (J,) w_j
    r3: np.ndarray  # (G,) R3_i
    r3_normalised: np.ndarray  # (G,) exp(R3_i / sum_j w_j)
    reasoning_tokens: list[int] = field(default_factory=list)  # k_i, tokens of c_i
    answer_start: list[int | None] = field(default_factory=list)  # first answer token, None if no delimiter
    answer_ids: list[int] = field(default_factory=list)  # the reference answer y, tokenised

    @property
    def query_score(self) -> float:
        """max_j sigma_j, the statistic of the query filter."""
        return float(self.sigma.max()) if self.sigma.size else 0.0


class DROProcessor(Processor):
    """DRO's R3 as reward and/or token weights, and the per-step group filter on max_j sigma_j
    (chapter 8; it saves no compute, see the module docstring; the paper's dataset-level query filter
    is :class:`rlcurate.curation.dro_filter.DroFilterSelector`). See :class:`DroConfig` for the arguments.

    After each step ``last_stats`` holds one :class:`DROStats` per input group (None for empty groups)
    and ``last_dropped`` the positions of the groups the filter removed.
    """

    name = "dro"

    def __init__(self, use_as: str = "reward", filter_fraction: float = 0.0, weight_power: float = 1.0,
                 reward_mix: float = 1.0, answer_template: str | None = None, append_eos: bool = True,
                 token_budget: int = 16384):
        if use_as not in USES:
            raise ValueError(f"use_as must be one of {', '.join(USES)}, got {use_as!r}")
        if not 0.0 <= float(filter_fraction) < 1.0:
            raise ValueError(f"filter_fraction must lie in [0, 1), got {filter_fraction!r}")
        if not 0.0 <= float(reward_mix) <= 1.0:
            raise ValueError(f"reward_mix must lie in [0, 1], got {reward_mix!r}")
        if not float(weight_power) >= 0:
            raise ValueError(f"weight_power must be >= 0, got {weight_power!r}")
        self.use_as = use_as
        self.filter_fraction = float(filter_fraction)
        self.weight_power = float(weight_power)
        self.reward_mix = float(reward_mix)
        self.answer_template = answer_template
        self.append_eos = bool(append_eos)
        self.token_budget = as_int(token_budget, "token_budget", minimum=1)
        self.last_stats: list[DROStats | None] = []
        self.last_dropped: list[int] = []

    # ------------------------------------------------------------------ statistics
    def statistics(self, ctx: StepContext, groups: Sequence[Group]) -> list[DROStats | None]:
        """Teacher-force each group's reference answer after each rollout's reasoning (one batched
        pass over all groups) and compute l, sigma, w, R3."""
        if ctx.tokenizer is None or ctx.sequence_logprobs is None:
            raise ValueError("DRO needs the language-model policy and its tokenizer (ctx.sequence_logprobs, ctx.tokenizer); "
                             "it cannot run on the simulated world")
        plans, contexts, answers, owner = reference_contexts(ctx, groups, self.answer_template, self.append_eos)
        ells = ctx.sequence_logprobs(contexts, answers, token_budget=self.token_budget) if contexts else []
        rows: dict[int, list[np.ndarray]] = {}
        for gi, e in zip(owner, ells):
            rows.setdefault(gi, []).append(e)
        stats: list[DROStats | None] = []
        for gi, plan in enumerate(plans):
            if plan is None:
                stats.append(None)
                continue
            ks, starts, y_ids = plan
            ell = np.stack(rows[gi])
            sigma = ell.std(axis=0)
            w = reflectivity_weights(sigma, self.weight_power)
            r3 = r3_scores(ell, w)
            norm = np.exp(r3 / max(float(w.sum()), 1e-12))
            stats.append(DROStats(ell, sigma, w, r3, norm, ks, starts, y_ids))
        return stats

    # ------------------------------------------------------------------ the three uses
    def filter(self, stats: Sequence[DROStats | None]) -> list[int]:
        """Positions of the groups the per-step group filter keeps (in order). The groups it drops
        were generated already: it saves no compute."""
        n = len(stats)
        n_drop = min(int(math.floor(self.filter_fraction * n + 1e-9)), max(n - 1, 0))
        if n_drop <= 0:
            return list(range(n))
        scores = np.array([s.query_score if s is not None else 0.0 for s in stats])
        order = np.lexsort((np.arange(n), scores))  # lowest score first, earlier group first on ties
        dropped = set(int(i) for i in order[:n_drop])
        return [i for i in range(n) if i not in dropped]

    def metrics(self) -> dict[str, float]:
        scores = [s.query_score for s in (self.last_stats or []) if s is not None]
        return {"dro_dropped": len(getattr(self, "last_dropped", []) or []),
                "dro_query_score_mean": float(np.mean(scores)) if scores else 0.0}

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        if self.use_as == "none" and self.filter_fraction == 0.0:
            self.last_stats, self.last_dropped = [], []
            return groups
        stats = self.statistics(ctx, groups)
        keep = self.filter(stats)
        self.last_stats = stats
        self.last_dropped = [i for i in range(len(groups)) if i not in set(keep)]
        out = []
        for i in keep:
            g, st = groups[i], stats[i]
            if st is None or self.use_as == "none":
                out.append(g)
                continue
            g = g.subset(range(g.size))  # a copy
            if self.use_as in ("reward", "both") and self.reward_mix > 0:
                if g.pool_size is None:
                    g.pool_successes, g.pool_size = g.successes, g.size
                g.rewards = (1.0 - self.reward_mix) * g.rewards + self.reward_mix * st.r3_normalised
            if self.use_as in ("token_weights", "both"):
                tws = [answer_span_weights(len(c.token_ids), start, st.weights)
                       for c, start in zip(g.completions, st.answer_start)]
                if g.token_weights is not None:
                    tws = [np.asarray(a, dtype=float) * b for a, b in zip(g.token_weights, tws)]
                g.token_weights = tws
            out.append(g)
        return out


@register("dro")
@dataclass
class DroConfig(StrategyConfig):
    """DRO (Xu et al., 2025; chapter 8): the reasoning-reflective reference-answer likelihood R3 as the
    reward (``use_as="reward"``), as per-token loss weights (``"token_weights"``), or both; plus a
    per-step group filter dropping the ``filter_fraction`` of each batch's already generated groups
    with the lowest max_j sigma_j (off by default; it saves no compute). ``weight_power`` k of
    w_j = sigma_j^k / mean sigma^k; ``reward_mix`` the share of R3 in the reward (1: replace);
    ``answer_template`` e.g. ``"#{answer}"`` overrides the task's format.

    The paper's query filter, which prunes the dataset every so many steps from rollouts of its own
    (and so does save the rollouts of the dropped queries), is the selector ``dro_filter``:
    ``strategy: dro_filter+dro`` combines it with these uses."""

    use_as: str = "reward"
    """``"reward"`` (the paper's use), ``"token_weights"``, ``"both"`` or ``"none"`` (only the
    per-step group filter)."""
    filter_fraction: float = 0.0
    """The per-step group filter: share in [0, 1) of a batch's already generated groups dropped,
    lowest max_j sigma_j first (0: off). It saves no compute (the dropped groups were generated and
    are counted); the paper's dataset-level query filter is the selector ``dro_filter``."""
    weight_power: float = 1.0
    """k of the reflectivity weights w_j = sigma_j^k / mean sigma^k (0: the plain log-likelihood)."""
    reward_mix: float = 1.0
    """Share of the normalised R3 in the reward, in [0, 1] (1 replaces the verifier's reward)."""
    answer_template: str | None = None
    """The reference answer as the model writes it, e.g. ``"#{answer}"`` (``None``: the task's format)."""
    append_eos: bool = True
    """Append the end-of-sequence token to the reference answer."""
    token_budget: int = 16384
    """Tokens per micro-batch of the teacher-forced scoring pass."""

    def build(self) -> Curator:
        return Curator(Selector(), Sampler(), [DROProcessor(self.use_as, self.filter_fraction, self.weight_power,
                                                            self.reward_mix, self.answer_template, self.append_eos,
                                                            self.token_budget)], name="dro")
