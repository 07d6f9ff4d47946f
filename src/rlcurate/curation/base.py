"""The curation interface: which prompts, how many rollouts, which samples, with what weight
(chapters 5-10). A strategy's author reads this file and touches only what it declares.

One training step (:func:`rlcurate.curation.step.run_step`, the same for the language model and
the simulated world) runs, in this order::

    indices = curator.select(ctx)            # which prompts this step          (Selector)
    groups  = curator.rollout(ctx, indices)  # n_i completions per prompt, rewards (Sampler; may call
                                             #   ctx.generate several times: rounds, hints)
    groups  = curator.process(ctx, groups)   # keep / downsample / reweight      (Processors)
    advantages = [group_advantages(g, ...)]  # group-relative, from each Group's fields
    policy.update(groups, advantages)        # loss and optimizer step
    curator.observe(ctx, groups)             # update beliefs and statistics

A :class:`Curator` is a Selector, a Sampler and a list of Processors, so strategies compose: INSIGHT's
selection with Reinforce-Ada's sequential sampling is ``Curator(InsightSelector(), AdaSeqSampler())``.
The trainer never knows which strategy runs.

**What a strategy may use.** Only its :class:`StepContext`: read-only facts of the step (``step``,
``group_size``, ``prompts_per_step``, ``problems``, ``task``, ``tokenizer``, ``rng``,
``generated_groups``) and four abilities, each counted where it costs compute: :meth:`StepContext.generate`
(scored rollouts, the only way to get them), :meth:`StepContext.generate_text` (unscored text, e.g. a
hint), :meth:`StepContext.more_prompts` (the next prompts of the selector, e.g. DAPO's oversampling)
and the policy's scores, :meth:`StepContext.sequence_logprobs` and :meth:`StepContext.grad_norms`. It
reads and writes the fields of :class:`Group` that each hook's docstring names. Every part keeps its
state in ``state_dict`` so that a resumed run continues exactly.

Adding a strategy: ``src/rlcurate/curation/README.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from rlcurate.errors import UserError
from rlcurate.seeding import generation_seed, named_stream, stream
from rlcurate.stats.advantages import centred, pool_advantages, rloo, standardised
from rlcurate.stats.gate import is_mixed
from rlcurate.tasks.base import Problem

if TYPE_CHECKING:
    from rlcurate.policy.base import Policy
    from rlcurate.rollout.base import Completion, RolloutEngine, SamplingParams


@dataclass
class Group:
    """The rollouts of one prompt that reach the trainer.

    Attributes:
        index: position of the problem in the training pool.
        problem: the problem itself.
        prompt: the exact text the completions were sampled from (including any hint).
        hint_level: 0 without a hint (chapter 7).
        completions: the sampled completions (:class:`rlcurate.rollout.Completion`).
        rewards: one reward in [0, 1] per completion.
        reasons: the verifier's reason per completion.
        baseline: a pass-rate estimate from a larger pool (Reinforce-Ada's p_hat); ``None`` means the
            group's own mean. ``grpo`` reads it only with ``pool_size`` set (its standard deviation is the
            pool's); ``drgrpo`` centres on it alone (:func:`group_advantages`).
        pool_successes, pool_size: successes and rollouts of the whole pool sampled for this prompt
            this step (equal to the group's own when nothing was discarded).
        weight: multiplies every advantage of the group (explicit f'(p) weights, 1/p_hat corrections).
        token_weights: optional per-completion arrays of per-token weights (DRO, chapter 8).
        generated: rollouts generated for this prompt this step, kept or not (compute accounting).
        generated_tokens: tokens generated for this prompt this step, kept or not.
    """

    index: int
    problem: Problem
    prompt: str
    completions: list
    rewards: np.ndarray
    reasons: list[str] = field(default_factory=list)
    hint_level: int = 0
    baseline: float | None = None
    pool_successes: float | None = None
    pool_size: int | None = None
    weight: float = 1.0
    token_weights: list[np.ndarray] | None = None
    generated: int = 0
    generated_tokens: int = 0

    @property
    def size(self) -> int:
        return len(self.completions)

    @property
    def mixed(self) -> bool:
        """True when the rewards are not all equal: the gate is open (chapter 1)."""
        return self.size > 1 and is_mixed(self.rewards)

    @property
    def successes(self) -> float:
        return float(np.sum(self.rewards >= 1.0))

    def subset(self, keep: Sequence[int]) -> "Group":
        """A copy holding only the completions at positions ``keep`` (pool statistics are kept)."""
        keep = list(keep)
        g = Group(**{**self.__dict__})
        g.completions = [self.completions[i] for i in keep]
        g.rewards = self.rewards[keep]
        g.reasons = [self.reasons[i] for i in keep] if self.reasons else []
        if self.token_weights is not None:
            g.token_weights = [self.token_weights[i] for i in keep]
        return g

    def merge(self, other: "Group") -> "Group":
        """Pool the completions of two groups of the same prompt (sequential sampling rounds)."""
        if other.index != self.index or other.prompt != self.prompt:
            raise ValueError("can only merge groups of the same prompt text")
        g = Group(**{**self.__dict__})
        g.completions = self.completions + other.completions
        g.rewards = np.concatenate([self.rewards, other.rewards])
        g.reasons = self.reasons + other.reasons
        g.generated = self.generated + other.generated
        g.generated_tokens = self.generated_tokens + other.generated_tokens
        return g


GROUP_ADVANTAGES = ("grpo", "drgrpo", "rloo")  # the kinds group_advantages computes


def group_advantages(group: Group, kind: str, eps: float) -> np.ndarray:
    """The advantage of each completion of ``group`` (chapter 5), times ``group.weight``:

    - ``grpo``: standardised, (r - mean r) / (std r + eps) with the Bessel std, or with a pool
      baseline (``group.baseline`` and ``group.pool_size`` set by a sampler) the pool's statistics,
      :func:`rlcurate.stats.advantages.pool_standardised`;
    - ``drgrpo``: centred, r - mean r, or r - p_hat with a pool baseline;
    - ``rloo``: leave-one-out, n/(n-1) (r - mean r).

    A group of one rollout gets A = 0 without a pool baseline (verl and TRL give r / (1 + eps): mean
    0, std 1 by their convention); |A| is bounded by :func:`rlcurate.stats.advantages.advantage_bound`.
    """
    r = group.rewards
    if r.size == 0:
        return r
    pooled = group.baseline is not None and bool(group.pool_size)
    if kind in ("grpo", "drgrpo") and pooled:  # a pool of one rollout gives A = 0, as pool_advantages says
        a = pool_advantages(r, group.baseline, group.pool_size, kind, eps)
    elif kind == "grpo":
        a = standardised(r, eps=eps, ddof=1)
    elif kind == "drgrpo":
        a = centred(r, baseline=group.baseline)
    elif kind == "rloo":
        a = rloo(r)
    else:
        raise ValueError(f"advantage must be one of {', '.join(GROUP_ADVANTAGES)}, got {kind!r}")
    return a * group.weight


@dataclass
class StepCounters:
    """Compute spent in one step (chapter 5): every rollout and token generated, kept or not."""

    rollouts: int = 0
    generated_tokens: int = 0
    generate_calls: int = 0
    generate_seconds: float = 0.0
    verify_seconds: float = 0.0
    uncharged_rollouts: int = 0
    """Rollouts an oracle arm sampled to learn pass rates for free (:meth:`StepContext.oracle_pass_rates`):
    never part of ``rollouts``, ``generated_tokens`` or any budget."""


class StepContext:
    """What a strategy may use during one step; built by the trainer (or the simulated world).

    Read-only facts:
        step: the step number (0-based).
        group_size: n, the rollouts per prompt the run was configured with.
        prompts_per_step: B, the prompts a step trains on.
        problems: the training pool; strategies speak of prompts by their index in it.
        task: the task (rewards, rendering, hints); ``None`` when a selector is driven from outside.
        tokenizer: the policy's tokenizer (``None`` in the simulated world).
        rng: this step's generator for a strategy's own random choices (stream ``curator``, seeded with the
            curator's seed: the run seed plus ``order_offset``, so an A/A control's other arm draws afresh).
        generated_groups: every group :meth:`generate` returned this step, kept or not.
        counters: what this step has spent so far (:class:`StepCounters`).

    Abilities, each accounted for: :meth:`generate`, :meth:`generate_text`, :meth:`more_prompts`,
    :meth:`sequence_logprobs` (and :meth:`sequence_logprobs_and_ranks`), :meth:`grad_norms`; and one
    that no practical strategy may use, :meth:`oracle_pass_rates` (the ceiling arms of chapter 11).
    Generation seeds come from (run seed, step, call number), so a resumed run reproduces every sample.

    ``engine`` and ``tokenizer`` may be given instead of a ``policy`` (tests, notebooks, selectors fed
    by another trainer): a policy that samples with that engine and scores nothing.
    """

    def __init__(self, *, step: int, seed: int, problems: Sequence[Problem], task, group_size: int,
                 prompts_per_step: int, policy: "Policy | None" = None, sampling: "SamplingParams | None" = None,
                 engine: "RolloutEngine | None" = None, tokenizer=None, render: Callable | None = None,
                 curator_seed: int | None = None, rng: np.random.Generator | None = None):
        if policy is None and engine is not None:
            from rlcurate.policy.base import SamplingPolicy

            policy = SamplingPolicy(engine, tokenizer)
        self.step = step
        self.group_size = group_size
        self.prompts_per_step = prompts_per_step
        self.problems = problems
        self.task = task
        self.tokenizer = getattr(policy, "tokenizer", None) if tokenizer is None else tokenizer
        self.rng = stream("curator", seed if curator_seed is None else curator_seed, step) if rng is None else rng
        self.generated_groups: list[Group] = []
        self.counters = StepCounters()
        self._seed = seed
        self._policy = policy
        self._sampling = sampling
        self._render = render
        self._calls = 0
        self._oracle_calls = 0
        self._processing: str | None = None  # the processor running (Curator.process): it may not generate
        self._more_prompts: Callable[[int], list[int]] | None = None  # bound by the Curator to its selector
        self._oracle_allowed: bool | None = None  # set by the Curator: does one of its parts declare uses_oracle?

    FACTS = ("step", "group_size", "prompts_per_step", "problems", "task", "tokenizer", "rng")

    def __setattr__(self, name: str, value) -> None:
        if name in self.FACTS and name in self.__dict__:  # set once, in __init__; ctx.group_size = 2 would halve groups
            raise StrategyError(f"ctx.{name} is a fact of the step, read-only for a strategy: keep what differs in "
                                f"the strategy's own attributes (rlcurate/curation/README.md)")
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ generation
    def render(self, index: int, hint: str | None = None, hint_mode: str | None = None) -> str:
        """The prompt text of problem ``index``, with ``hint`` written in where the task puts hints, or
        where ``hint_mode`` says (``"prefix"``: start of the assistant turn, ``"user"``: the user turn;
        chapter 7). With ``hint_mode=None`` the task's own placement, as before."""
        problem = self.problems[index]
        if self._render is not None:
            return self._render(problem, hint) if hint_mode is None else self._render(problem, hint, hint_mode)
        if hint_mode is None:
            return self.task.render(problem, self.tokenizer, hint=hint)
        return self.task.render(problem, self.tokenizer, hint=hint, hint_mode=hint_mode)

    def _next_seed(self) -> int:
        self._calls += 1
        return generation_seed(self._seed, self.step, self._calls)

    def _sample(self, prompts, n, params) -> list:
        if self._policy is None:
            raise RuntimeError("this StepContext has no policy to generate with")
        t0 = time.perf_counter()
        out = self._policy.generate(prompts, n, params, self._next_seed())
        self.counters.generate_calls += 1
        self.counters.generate_seconds += time.perf_counter() - t0
        return out

    def generate(self, indices: Sequence[int], n, hints: Sequence[str | None] | None = None,
                 hint_levels: Sequence[int] | None = None, hint_mode: str | None = None) -> list[Group]:
        """Sample ``n`` (a number or one per prompt) completions for each problem index at the run's
        sampling parameters, score them with the task, and return one :class:`Group` per index (groups
        of size 0 included). ``hints[k]`` is written into prompt k (``hint_levels[k]`` records its
        level), placed as ``hint_mode`` says (:meth:`render`). Costs: every rollout and token is added
        to :attr:`counters`; this is the only way a strategy gets scored rollouts."""
        self._not_processing("generate")
        indices = pool_indices(indices, len(self.problems), "ctx.generate takes pool indices (ints), got {got}",
                               "ctx.generate: index {i} is outside the pool of {n} prompts")
        hints = list(hints) if hints is not None else [None] * len(indices)
        levels = list(hint_levels) if hint_levels is not None else [0] * len(indices)
        if len(hints) != len(indices) or len(levels) != len(indices):
            raise ValueError("hints and hint_levels need one entry per index")
        prompts = [self.render(i, h, hint_mode) for i, h in zip(indices, hints)]
        out = self._sample(prompts, n, self._sampling)
        t1 = time.perf_counter()
        groups = []
        for i, prompt, lvl, comps in zip(indices, prompts, levels, out):
            problem = self.problems[i]
            verdicts = [self.task.reward(problem, c.text) for c in comps]
            tokens = sum(len(c.token_ids) for c in comps)
            groups.append(Group(index=i, problem=problem, prompt=prompt, completions=list(comps),
                                rewards=np.array([v.value for v in verdicts], dtype=float),
                                reasons=[v.reason for v in verdicts], hint_level=lvl,
                                generated=len(comps), generated_tokens=tokens))
            self.counters.rollouts += len(comps)
            self.counters.generated_tokens += tokens
        self.counters.verify_seconds += time.perf_counter() - t1
        self.generated_groups.extend(groups)
        return groups

    def generate_text(self, prompts: Sequence[str], max_new_tokens: int) -> list["Completion"]:
        """One unscored completion of each (already rendered) prompt, at the run's temperature and
        top-p with ``max_new_tokens``: text a strategy writes for itself, such as SAGE's self-hints.
        Costs: its tokens count as generated (:attr:`counters`), its completions are not rollouts."""
        from rlcurate.rollout.base import SamplingParams

        self._not_processing("generate_text")
        params = SamplingParams(temperature=self._sampling.temperature, top_p=self._sampling.top_p,
                                max_new_tokens=int(max_new_tokens))
        out = [comps[0] if comps else None for comps in self._sample(list(prompts), 1, params)]
        self.counters.generated_tokens += sum(len(c.token_ids) for c in out if c is not None)
        return out

    def _not_processing(self, method: str) -> None:
        if self._processing is not None:
            raise StrategyError(f"processor {self._processing!r}: process called ctx.{method}; a processor keeps, drops "
                                f"or reweights the groups it is given and generates nothing (a sampler generates; "
                                f"rlcurate/curation/README.md)")

    def more_prompts(self, k: int) -> list[int]:
        """The next ``k`` prompt indices by the selector (:meth:`Selector.more`: DAPO's oversampling, chapter 6).
        Costs nothing until they are generated; the selector's pass over the pool moves on."""
        if self._more_prompts is None:
            raise RuntimeError("more_prompts needs a selector; run the sampler inside a Curator")
        return self._more_prompts(int(k))

    @property
    def knows_pass_rates(self) -> bool:
        """True where :meth:`oracle_pass_rates` is exact and free (the simulated world)."""
        return getattr(self._policy, "pass_rates", None) is not None

    def oracle_pass_rates(self, indices: Sequence[int], runs: int = 8, exact: bool = True) -> np.ndarray:
        """The current pass rate of each problem, known for free: the ceiling arms of chapter 11 (*When
        does curation pay?*, the value of perfect information) use it; a practical strategy must not.

        Exact where the policy knows it (the simulated world's ``pass_rates``) and ``exact`` is true. Otherwise the share of
        ``runs`` rollouts per problem, sampled from the current policy at the run's sampling parameters
        on a seed stream of its own (the charged calls keep their seeds), rewarded 1 or more counted as
        right. Those rollouts are *not charged*: they go to ``counters.uncharged_rollouts``, never to
        ``rollouts``, ``generated_tokens`` or ``generated_groups``."""
        if self._oracle_allowed is False:
            raise StrategyError("ctx.oracle_pass_rates is for the ceiling arms of chapter 11 alone: a part that reads "
                                "it declares uses_oracle = True, and is never a practical strategy")
        indices = [int(i) for i in indices]
        if exact and self.knows_pass_rates:
            return np.asarray(self._policy.pass_rates([self.problems[i] for i in indices]), dtype=float)
        if self._policy is None:
            raise RuntimeError("this StepContext has no policy to estimate pass rates with")
        self._oracle_calls += 1
        seed = int(named_stream("oracle_pass_rates", self._seed, self.step, self._oracle_calls).integers(0, 2**62))
        out = self._policy.generate([self.render(i) for i in indices], int(runs), self._sampling, seed)
        self.counters.uncharged_rollouts += sum(len(c) for c in out)
        return np.array([np.mean([self.task.reward(self.problems[i], c.text).value >= 1.0 for c in comps])
                         if comps else np.nan for i, comps in zip(indices, out)], dtype=float)

    # ------------------------------------------------------------------ the policy's scores
    @property
    def sequence_logprobs(self) -> Callable[..., list[np.ndarray]] | None:
        """``sequence_logprobs(contexts, continuations, token_budget=None)``: log pi(y_j | context,
        y_<j) of each continuation under the current policy, no gradient, in micro-batches of at most
        ``token_budget`` tokens (DRO's teacher-forced reference answer, chapter 8). Costs a forward
        pass; not counted as generation. ``None`` when the policy cannot score token sequences (the
        simulated world)."""
        return getattr(self._policy, "sequence_logprobs", None)

    @property
    def sequence_logprobs_and_ranks(self) -> Callable[..., list[tuple[np.ndarray, np.ndarray]]] | None:
        """``sequence_logprobs_and_ranks(contexts, continuations, token_budget=None)``: as
        :attr:`sequence_logprobs`, each continuation token's log-probability paired with its rank under
        the policy (1: the most likely token; DRO's dataset filter, chapter 8). Costs a forward pass;
        ``None`` when the policy cannot score token sequences (the simulated world)."""
        return getattr(self._policy, "sequence_logprobs_and_ranks", None)

    @property
    def grad_norms(self) -> Callable[[Group], np.ndarray] | None:
        """``grad_norms(group)``: ||grad log pi(y | x)|| of each completion of the group under the
        current policy (GVM's G_i, chapter 3). Costs a forward and backward pass per completion.
        ``None`` when the policy gives none."""
        return getattr(self._policy, "grad_norms", None)


class Part:
    """What the three parts of a curator share: the observe hook, diagnostics and resumable state."""

    name = "part"
    uses_oracle = False
    """True for a ceiling arm (chapter 11) alone: it may call :meth:`StepContext.oracle_pass_rates`."""

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        """After the update: the trained groups (and ``ctx.generated_groups``, everything generated
        this step) to learn from. Reads any field of a Group; writes none (a step whose rewards change
        here stops with an error: the logs and the next steps would read rewards nobody scored)."""

    def metrics(self) -> dict[str, float]:
        """Scalar diagnostics of the last step (logged as ``curation/<key>``); none by default."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly (JSON values); nothing by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Selector(Part):
    """Chooses the prompts of a step. Default: passes (epochs) over the pool, each in a seeded random
    order (stream ``epoch_order``)."""

    name = "uniform"
    needs_trainer: str | None = None
    """Why this selector runs only inside this package's step (it generates or scores with the policy), or
    ``None``: it chooses from prompt indices and the rewards it observes alone, so another trainer can host it
    (:mod:`rlcurate.interop`; an adapter refuses the others when it is built)."""

    def __init__(self):
        self.epoch = 0
        self.cursor = 0
        self._order: np.ndarray | None = None

    def bind(self, n_items: int, seed: int) -> None:
        """Called once, before the first step: sets ``self.n_items``, the size of the training pool, and
        ``self.seed``, the curator's seed (the run seed plus ``order_offset``), on which a selector's own named
        streams are keyed (``rlcurate.seeding.named_stream(name, self.seed, ...)``)."""
        self.n_items = n_items
        self.seed = seed

    def _epoch_order(self) -> np.ndarray:
        return stream("epoch_order", self.seed, self.epoch).permutation(self.n_items)

    def draw(self, k: int) -> list[int]:
        """The next ``k`` prompts of the epoch order (wrapping into the next epoch). A selector that
        passes over a subset of the pool overrides only :meth:`_epoch_order`."""
        out: list[int] = []
        while len(out) < k:
            if self._order is None:
                self._order = self._epoch_order()
            n = len(self._order)
            take = min(k - len(out), n - self.cursor)
            out.extend(int(i) for i in self._order[self.cursor:self.cursor + take])
            self.cursor += take
            if self.cursor >= n:
                self.epoch, self.cursor, self._order = self.epoch + 1, 0, None
        return out

    def select(self, ctx: StepContext, k: int) -> list[int]:
        """The ``k`` prompt indices (into ``ctx.problems``) of this step; an index may repeat.
        Reads the context's facts and ``ctx.rng``; generates nothing (a selector that must look at
        rollouts to choose, like a live prefilter, may call ``ctx.generate``, which is counted)."""
        return self.draw(k)

    def more(self, ctx: StepContext, k: int) -> list[int]:
        """``k`` more prompts later in the same step, after :meth:`select` (what ``ctx.more_prompts`` returns
        to a sampler: DAPO's refills, GRESO's and Pilot-Commit's further pilots). Default: the next ``k`` of
        :meth:`draw`. A selector that chooses by a rule overrides this one, with the step's ``ctx`` at hand."""
        return self.draw(k)

    def take(self, indices) -> None:
        """Mark ``indices`` as the prompts of the step now running, for a host that selected them ahead of it
        (TRL's and verl's samplers choose a generation batch or more early, so a later :meth:`select` may have
        run since): :meth:`more` then chooses among the others, as after :meth:`select`. Nothing by default."""

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self._order = int(state["epoch"]), int(state["cursor"]), None


class Sampler(Part):
    """Produces the groups of the selected prompts. Default: ``group_size`` rollouts each.

    ``pool_baseline`` says that the sampler sets every group's ``baseline`` from a larger pool of
    rollouts (Reinforce-Ada), so a trained group of one rollout still has a non-zero advantage."""

    name = "group"
    pool_baseline = False

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        """One :class:`Group` per prompt rolled out: the selected indices in order, then those taken with
        ``ctx.more_prompts`` (DAPO's refills), from ``ctx.generate`` (called as often
        as the sampler likes: rounds, hint levels; ``ctx.more_prompts`` adds prompts). May set on a
        Group: ``baseline``, ``pool_size``, ``pool_successes`` (a larger pool's statistics),
        ``weight`` and ``token_weights``; may merge (:meth:`Group.merge`) or subset groups."""
        return ctx.generate(indices, ctx.group_size)


class Processor(Part):
    """Transforms groups after sampling (filter, downsample, reweight)."""

    name = "identity"

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        """The groups to train on: may drop groups, keep a subset of a group's completions
        (:meth:`Group.subset`) and set ``baseline``, ``pool_size``, ``pool_successes``, ``weight``
        and ``token_weights``; may score with ``ctx.sequence_logprobs`` / ``ctx.grad_norms``. Must not
        generate: what a processor drops was still paid for, and is counted."""
        return groups


class StrategyError(UserError):
    """A part of a strategy broke the contract of ``rlcurate/curation/README.md`` (indices outside the pool,
    something other than Groups, a weight that is not finite, rewards changed in ``observe``, state that JSON
    does not keep): one line naming the part, on the command line as any bad input."""


class Curator:
    """A selector, a sampler and processors, composed (see the module docstring)."""

    def __init__(self, selector: Selector | None = None, sampler: Sampler | None = None,
                 processors: Sequence[Processor] = (), name: str | None = None):
        self.selector = selector or Selector()
        self.sampler = sampler or Sampler()
        self.processors = list(processors)
        self.name = name or "+".join([self.selector.name, self.sampler.name] + [p.name for p in self.processors])
        self._n_items: int | None = None
        self.state_checked = False  # check_state ran (after the first step this process runs)

    @property
    def parts(self) -> list[Part]:
        """The selector, the sampler and the processors, in that order."""
        return [self.selector, self.sampler, *self.processors]

    def bind(self, n_items: int, seed: int) -> None:
        self._n_items = int(n_items)
        self.selector.bind(n_items, seed)
        for part in [self.sampler, *self.processors]:
            if hasattr(part, "bind"):
                part.bind(n_items, seed)

    def _bind_context(self, ctx: StepContext) -> None:
        ctx._more_prompts = self._more(ctx)
        ctx._oracle_allowed = any(part.uses_oracle for part in self.parts)

    def select(self, ctx: StepContext) -> list[int]:
        self._bind_context(ctx)
        picked = self._checked_indices(self.selector.select(ctx, ctx.prompts_per_step))
        if not picked:  # fewer or more than prompts_per_step is a selector's choice (Pilot-Commit's pilots)
            raise StrategyError(f"selector {self.selector.name!r}: select returned no prompts; a step trains on "
                                f"prompts_per_step={ctx.prompts_per_step} of them, or the selector's own number")
        return picked

    def _more(self, ctx: StepContext) -> Callable[[int], list[int]]:
        """``ctx.more_prompts``: the selector's :meth:`Selector.more`, its indices checked as :meth:`select`'s."""
        return lambda k: self._checked_indices(self.selector.more(ctx, k), "more")

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        self._bind_context(ctx)
        groups = self.sampler.rollout(ctx, indices)
        if not isinstance(groups, list) or not all(isinstance(g, Group) for g in groups):
            bad = groups if not isinstance(groups, list) else next(g for g in groups if not isinstance(g, Group))
            raise StrategyError(f"sampler {self.sampler.name!r}: rollout must return a list of Group (what "
                                f"ctx.generate returns), got {type(bad).__name__} {str(bad)[:60]}")
        return groups

    def _checked_indices(self, picked, method: str = "select") -> list[int]:
        """The selector's prompts as Python ints in the pool (:func:`pool_indices`)."""
        who = f"selector {self.selector.name!r}: {method}"
        return pool_indices(picked, self._n_items, who + " must return pool indices (ints), got {got}",
                            who + " returned index {i}, outside the pool of {n} prompts")

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        for p in self.processors:
            ctx._processing = p.name
            try:
                groups = p.process(ctx, groups)
            finally:
                ctx._processing = None
            if not isinstance(groups, list) or not all(isinstance(g, Group) for g in groups):
                raise StrategyError(f"processor {p.name!r}: process must return a list of Group, got "
                                    f"{type(groups).__name__}")
            bad = next((g for g in groups if not np.isfinite(g.weight)), None)
            if bad is not None:  # the loss, the gradient and then every weight of the model would be NaN
                raise StrategyError(f"processor {p.name!r}: the group of prompt {bad.problem.uid!r} has weight "
                                    f"{float(bad.weight)!r}; a group's weight must be finite")
        return groups

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        for part in self.parts:
            part.observe(ctx, groups)

    def metrics(self) -> dict[str, float]:
        """Every part's diagnostics of the last step, as ``curation/<key>`` (the trainer logs them)."""
        out: dict[str, float] = {}
        for part in self.parts:
            values = part.metrics()
            try:
                out.update({f"curation/{k}": float(v) for k, v in values.items()})
            except (AttributeError, TypeError, ValueError):
                raise StrategyError(f"{type(part).__name__} {part.name!r}: metrics must return a dict of numbers, got "
                                    f"{str(values)[:80]}") from None
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"selector": self.selector.state_dict(), **self.rollout_state_dict()}

    def check_state(self) -> None:
        """Raise :class:`StrategyError` where a part's :meth:`Part.state_dict` does not come back the same through
        JSON, which is how a checkpoint stores it: a value JSON cannot hold (an array, a set) would fail only when
        the first checkpoint is written, after its steps; an int-keyed map comes back with string keys, so a resumed
        run would continue from other state without a word. :func:`rlcurate.curation.step.run_step` calls it after
        the curator's first step."""
        import json

        self.state_checked = True
        for part in self.parts:
            state = part.state_dict()
            try:
                back = json.loads(json.dumps(state, allow_nan=True))
            except (TypeError, ValueError) as exc:
                raise StrategyError(f"{type(part).__name__} {part.name!r}: state_dict cannot be stored as JSON "
                                    f"({exc}); keep lists, dicts with string keys, numbers and strings "
                                    f"(rlcurate/curation/README.md)") from None
            where = _json_difference(state, back)
            if where is not None:
                raise StrategyError(f"{type(part).__name__} {part.name!r}: state_dict{where} does not come back the "
                                    f"same from JSON (int keys become strings): a resumed run would continue from "
                                    f"other state; store int-keyed maps as rows (rlcurate/curation/README.md)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selector.load_state_dict(state["selector"])
        self.load_rollout_state_dict(state)

    def rollout_state_dict(self) -> dict[str, Any]:
        """The sampler's and processors' state alone: what a host saves beside a selection it keeps itself
        (:class:`rlcurate.interop.PromptSelection` carries the selector's)."""
        return {"sampler": self.sampler.state_dict(), "processors": [p.state_dict() for p in self.processors]}

    def load_rollout_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        for p, s in zip(self.processors, state["processors"]):
            p.load_state_dict(s)


def _json_difference(value, back, path: str = "") -> str | None:
    """The first place (``["key"][0]``) where ``back``, ``value`` read back from JSON, differs from it; None
    where they are the same (floats compared as numbers, NaN equal to NaN)."""
    if isinstance(value, dict):
        if not isinstance(back, dict) or list(value) != list(back):
            key = next((k for k in value if not isinstance(k, str)), None)
            return f"{path}[{key!r}]" if key is not None else path
        return next((d for k in value if (d := _json_difference(value[k], back[k], f"{path}[{k!r}]")) is not None),
                    None)
    if isinstance(value, (list, tuple)):
        if not isinstance(back, list) or len(value) != len(back):  # a tuple comes back a list, which loads alike
            return path
        return next((d for i, (a, b) in enumerate(zip(value, back))
                     if (d := _json_difference(a, b, f"{path}[{i}]")) is not None), None)
    same = value == back or (isinstance(value, float) and isinstance(back, float) and value != value and back != back)
    return None if same else path


def pool_indices(indices, n_items: int | None, not_int: str, outside: str) -> list[int]:
    """``indices`` as Python ints in a pool of ``n_items`` (``None``: not checked against it). A float, a bool or
    an index outside the pool is the strategy's mistake, named here (``not_int`` with ``{got}``, ``outside`` with
    ``{i}`` and ``{n}``) rather than met later as a wrong prompt or an IndexError in rendering."""
    out = []
    for i in list(indices):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise StrategyError(not_int.format(got=f"{type(i).__name__} {i!r}"))
        if n_items is not None and not 0 <= int(i) < n_items:
            raise StrategyError(outside.format(i=int(i), n=n_items))
        out.append(int(i))
    return out
