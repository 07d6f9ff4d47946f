"""DAPO's dynamic sampling (Yu et al., 2025), chapter 6, *Adaptive sampling*.

A group whose rewards are all equal has zero advantage under every group-relative rule, so it spends
generation compute and teaches nothing (chapter 1). DAPO keeps only *mixed* groups,

    keep group i  iff  0 < #correct_i < n     (verl: std(metric) > 0),

(here: the rewards are not all equal, :attr:`Group.mixed`; with graded rewards that is verl's
``metric=score``, with binary rewards the same as ``metric=acc``),

and, when a generation batch holds fewer than B mixed groups, it draws more prompts and generates
again, up to ``max_num_gen_batches`` generation batches; then it truncates to B groups. The price
is paid in rollouts: every generated rollout counts toward the step's compute, kept or not.

Here :class:`DapoSampler` does the oversampling (it asks the curator's selector for more prompts
through ``ctx.more_prompts``) and :class:`DapoFilter` keeps the first B mixed groups in generation
order. Two deliberate differences from verl's ``RayDAPOTrainer``: when the cap is reached with fewer
than B mixed groups this step trains on what it found (verl raises an error), and a group of one
rollout is dropped (verl keeps ``len == 1`` groups; here a single rollout has no group baseline).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["DapoSampler", "DapoFilter", "DapoConfig", "first_mixed"]

log = logging.getLogger(__name__)


def first_mixed(mixed: Sequence[bool], wanted: int) -> list[int]:
    """Positions of the first ``wanted`` mixed groups, in generation order: what DAPO trains on (the one rule this
    package's filter and the TRL drop-in, :mod:`rlcurate.interop.trl`, share)."""
    return [i for i, m in enumerate(mixed) if m][:wanted]


class DapoSampler(Sampler):
    """Generate ``group_size`` rollouts per prompt in generation batches until at least B
    (``ctx.prompts_per_step``) groups are mixed or ``max_num_gen_batches`` batches were generated.

    Args:
        gen_batch_size: prompts per generation batch. The first batch is the selected prompts, topped
            up from the selector when ``gen_batch_size`` exceeds them; later batches draw
            ``gen_batch_size`` fresh prompts. Default ``None``: B (the DAPO recipe uses 3 B).
        max_num_gen_batches: cap on generation batches per step (the DAPO recipe uses 10; verl's 0,
            "no cap", is not offered because a pool without mixed prompts would never stop).

    Returns every generated group (uniform ones included), in generation order; ``last_batches`` and
    ``last_mixed`` record what the latest step needed.
    """

    name = "dapo"

    def __init__(self, gen_batch_size: int | None = None, max_num_gen_batches: int = 10):
        if gen_batch_size is not None and (isinstance(gen_batch_size, bool) or int(gen_batch_size) != gen_batch_size
                                           or gen_batch_size < 1):
            raise ValueError(f"gen_batch_size must be a positive integer or None, got {gen_batch_size!r}")
        if isinstance(max_num_gen_batches, bool) or int(max_num_gen_batches) != max_num_gen_batches \
                or max_num_gen_batches < 1:
            raise ValueError(f"max_num_gen_batches must be a positive integer, got {max_num_gen_batches!r}")
        self.gen_batch_size = None if gen_batch_size is None else int(gen_batch_size)
        self.max_num_gen_batches = int(max_num_gen_batches)
        self.last_batches = 0
        self.last_mixed = 0

    def metrics(self) -> dict[str, float]:
        return {"dapo_gen_batches": self.last_batches, "dapo_mixed": self.last_mixed}

    def wants_more(self, mixed: int, batches: int, wanted: int) -> bool:
        """Whether to generate another batch: fewer than ``wanted`` mixed groups so far, and the cap not reached."""
        return mixed < wanted and batches < self.max_num_gen_batches

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        B = ctx.prompts_per_step
        size = self.gen_batch_size or B
        first = list(indices)
        if size > len(first):
            first += ctx.more_prompts(size - len(first))
        groups = ctx.generate(first, ctx.group_size)
        batches = 1
        mixed = sum(g.mixed for g in groups)
        while self.wants_more(mixed, batches, B):
            more = ctx.generate(ctx.more_prompts(size), ctx.group_size)
            groups.extend(more)
            mixed += sum(g.mixed for g in more)
            batches += 1
        if mixed < B:
            log.warning("dapo: step %d found %d mixed groups of the %d wanted after %d generation batches "
                        "(%d rollouts); training on what was found", ctx.step, mixed, B, batches,
                        sum(g.generated for g in groups))
        self.last_batches, self.last_mixed = batches, mixed
        return groups


class DapoFilter(Processor):
    """Keep the mixed groups (rewards not all equal), then the first B of them in generation order."""

    name = "mixed_filter"

    def process(self, ctx: StepContext, groups: list[Group]) -> list[Group]:
        return [groups[i] for i in first_mixed([g.mixed for g in groups], ctx.prompts_per_step)]

    def state_dict(self) -> dict[str, Any]:
        return {}


@register("dapo")
@dataclass
class DapoConfig(StrategyConfig):
    """DAPO dynamic sampling (Yu et al., 2025; chapter 6): oversample prompts until B groups are
    mixed (at most ``max_num_gen_batches`` generation batches of ``gen_batch_size`` prompts, default
    B), train on the first B mixed groups. Every generated rollout is counted."""

    gen_batch_size: int | None = None
    """Prompts per generation batch (``None``: B; the DAPO recipe uses 3 B). The first batch is the
    selected prompts, topped up from the selector; later batches draw this many fresh prompts."""
    max_num_gen_batches: int = 10
    """Cap on generation batches per step (the DAPO recipe's 10; verl's 0, no cap, is not offered)."""

    def build(self) -> Curator:
        return Curator(Selector(), DapoSampler(self.gen_batch_size, self.max_num_gen_batches), [DapoFilter()],
                       name="dapo")
