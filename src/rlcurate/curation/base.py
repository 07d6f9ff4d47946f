"""The curation interface: which prompts, how many rollouts, which samples, with what weight
(chapters 5-10).

One training step runs, in this order (see :class:`rlcurate.train.Trainer`)::

    indices = curator.select(ctx)          # which prompts this step          (Selector)
    groups  = curator.rollout(ctx, indices) # n_i completions per prompt, rewards (Sampler; may call
                                            #   ctx.generate several times: rounds, hints)
    groups  = curator.process(ctx, groups)  # keep / downsample / reweight      (Processors)
    ...advantages, loss, optimizer step...
    curator.observe(ctx, groups)            # update beliefs and statistics

A :class:`Curator` is a Selector, a Sampler and a list of Processors, so strategies compose: INSIGHT's
selection with Reinforce-Ada's sequential sampling is ``Curator(InsightSelector(), AdaSeqSampler())``.
The trainer never knows which strategy runs. Every part keeps its state in ``state_dict`` so that a
resumed run continues exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from rlcurate.tasks.base import Problem


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
            group's own mean.
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
        return self.size > 1 and float(np.max(self.rewards) - np.min(self.rewards)) > 0

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


@dataclass
class StepCounters:
    """Compute spent in one step (chapter 5): every rollout and token generated, kept or not."""

    rollouts: int = 0
    generated_tokens: int = 0
    generate_calls: int = 0
    generate_seconds: float = 0.0
    verify_seconds: float = 0.0


class StepContext:
    """Everything a curator may use during one step; built by the trainer.

    ``generate`` is the only way a curator gets rollouts, so compute is always accounted for, seeds
    are derived from (run seed, step, call number) and a resumed run reproduces every sample.
    """

    def __init__(self, *, step: int, seed: int, problems: Sequence[Problem], task, tokenizer, engine,
                 sampling, group_size: int, prompts_per_step: int, extra: dict | None = None,
                 policy=None, render: Callable | None = None, grad_norms: Callable | None = None):
        self.step = step
        self.seed = seed
        self.problems = problems
        self.task = task
        self.tokenizer = tokenizer
        self.engine = engine
        self.sampling = sampling
        self.group_size = group_size
        self.prompts_per_step = prompts_per_step
        self.rng = np.random.default_rng([seed, step, 17])
        self.counters = StepCounters()
        self.extra = extra or {}
        self.policy = policy  # the model being trained (DRO scores with it)
        # grad_norms(group) -> one gradient norm ||grad log pi(y | x)|| per completion (GVM, chapter 3)
        self.grad_norms = grad_norms
        self._render = render
        self._calls = 0
        self.selector = None  # set by the Curator: samplers that need more prompts (DAPO) ask it
        self.generated_groups: list[Group] = []  # every group generate() returned this step, kept or not

    def render(self, index: int, hint: str | None = None) -> str:
        problem = self.problems[index]
        if self._render is not None:
            return self._render(problem, hint)
        return self.task.render(problem, self.tokenizer, hint=hint)

    def next_seed(self) -> int:
        """A fresh generation seed for this step (deterministic in the run seed, step and call)."""
        self._calls += 1
        mixed = np.random.default_rng([self.seed, self.step, self._calls]).integers(0, 2**62)
        return int(mixed)

    def generate(self, indices: Sequence[int], n, hints: Sequence[str | None] | None = None,
                 hint_levels: Sequence[int] | None = None, sampling=None) -> list[Group]:
        """Sample ``n`` (a number or one per prompt) completions for each problem index, score them,
        and return one :class:`Group` per index (groups of size 0 included)."""
        indices = [int(i) for i in indices]
        hints = list(hints) if hints is not None else [None] * len(indices)
        levels = list(hint_levels) if hint_levels is not None else [0] * len(indices)
        if len(hints) != len(indices) or len(levels) != len(indices):
            raise ValueError("hints and hint_levels need one entry per index")
        prompts = [self.render(i, h) for i, h in zip(indices, hints)]
        t0 = time.perf_counter()
        out = self.engine.generate(prompts, n, sampling or self.sampling, seed=self.next_seed())
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
        self.counters.generate_calls += 1
        self.counters.generate_seconds += t1 - t0
        self.counters.verify_seconds += time.perf_counter() - t1
        self.generated_groups.extend(groups)
        return groups


class Selector:
    """Chooses the prompts of a step. Default: epochs over the pool in a seeded random order."""

    name = "uniform"

    def __init__(self):
        self.epoch = 0
        self.cursor = 0
        self._order: np.ndarray | None = None

    def bind(self, n_items: int, seed: int) -> None:
        """Called once by the trainer with the size of the training pool."""
        self.n_items = n_items
        self.seed = seed

    def _epoch_order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch, 3]).permutation(self.n_items)

    def draw(self, k: int) -> list[int]:
        """The next ``k`` prompts of the epoch order (wrapping into the next epoch)."""
        out: list[int] = []
        while len(out) < k:
            if self._order is None:
                self._order = self._epoch_order()
            take = min(k - len(out), self.n_items - self.cursor)
            out.extend(int(i) for i in self._order[self.cursor:self.cursor + take])
            self.cursor += take
            if self.cursor >= self.n_items:
                self.epoch, self.cursor, self._order = self.epoch + 1, 0, None
        return out

    def select(self, ctx: StepContext, k: int) -> list[int]:
        return self.draw(k)

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Scalar diagnostics of the last step (logged as ``curation/<name>``); none by default."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self._order = int(state["epoch"]), int(state["cursor"]), None


class Sampler:
    """Produces the groups of the selected prompts. Default: ``group_size`` rollouts each."""

    name = "group"

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        return ctx.generate(indices, ctx.group_size)

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Scalar diagnostics of the last step (logged as ``curation/<name>``); none by default."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Processor:
    """Transforms groups after sampling (filter, downsample, reweight)."""

    name = "identity"

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        return groups

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Scalar diagnostics of the last step (logged as ``curation/<name>``); none by default."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Curator:
    """A selector, a sampler and processors, composed (see the module docstring)."""

    def __init__(self, selector: Selector | None = None, sampler: Sampler | None = None,
                 processors: Sequence[Processor] = (), name: str | None = None):
        self.selector = selector or Selector()
        self.sampler = sampler or Sampler()
        self.processors = list(processors)
        self.name = name or "+".join([self.selector.name, self.sampler.name] + [p.name for p in self.processors])

    def bind(self, n_items: int, seed: int) -> None:
        self.selector.bind(n_items, seed)
        for part in [self.sampler, *self.processors]:
            if hasattr(part, "bind"):
                part.bind(n_items, seed)

    def select(self, ctx: StepContext) -> list[int]:
        ctx.selector = self.selector
        return self.selector.select(ctx, ctx.prompts_per_step)

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        ctx.selector = self.selector
        return self.sampler.rollout(ctx, indices)

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        for p in self.processors:
            groups = p.process(ctx, groups)
        return groups

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        for part in [self.selector, self.sampler, *self.processors]:
            part.observe(ctx, groups)

    def metrics(self) -> dict[str, float]:
        """Every part's diagnostics of the last step, as ``curation/<key>`` (the trainer logs them)."""
        out: dict[str, float] = {}
        for part in [self.selector, self.sampler, *self.processors]:
            out.update({f"curation/{k}": float(v) for k, v in part.metrics().items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"selector": self.selector.state_dict(), "sampler": self.sampler.state_dict(),
                "processors": [p.state_dict() for p in self.processors]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selector.load_state_dict(state["selector"])
        self.sampler.load_state_dict(state["sampler"])
        for p, s in zip(self.processors, state["processors"]):
            p.load_state_dict(s)
