"""One training step, the same in every world (chapter 5, *The GRPO loop*).

:func:`run_step` is the loop the language-model trainer (:class:`rlcurate.train.Trainer`) and the
simulated world (:class:`rlcurate.sim.bridge.SimTrainer`) both run; they differ only in their
:class:`~rlcurate.policy.base.Policy` (how completions are sampled and how an update is made)::

    indices  = curator.select(ctx)
    sampled  = curator.rollout(ctx, indices)
    trained  = curator.process(ctx, sampled)
    A_g      = group_advantages(g, advantage, eps)  for every trained group g
    stats    = policy.update(trained, A)
    curator.observe(ctx, trained)

:class:`StepOutcome` carries what happened and the statistics every world logs, computed once here:
the outcome shares of the sampled groups (mixed = the effective-prompt ratio, all right, all wrong;
:func:`rlcurate.stats.gate.outcome_shares`) and the compute spent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlcurate.curation.base import Curator, Group, StepContext, StepCounters, StrategyError, group_advantages
from rlcurate.stats.gate import outcome_shares

if TYPE_CHECKING:
    from rlcurate.policy.base import Policy

__all__ = ["StepOutcome", "run_step", "drop_nonfinite_rewards", "group_metrics"]

log = logging.getLogger(__name__)


@dataclass
class StepOutcome:
    """What one step did: the groups sampled and trained, their advantages, the policy's update
    statistics, the compute spent and the seconds spent sampling (select, rollout, process) and
    training (advantages, update, observe)."""

    sampled: list[Group]
    trained: list[Group]
    advantages: list[np.ndarray]
    update: dict[str, Any]
    counters: StepCounters
    sample_seconds: float
    train_seconds: float
    nonfinite_rewards: int = 0
    metrics: dict[str, float] | None = None
    """:func:`group_metrics` of the step, taken before ``observe``."""

    def group_metrics(self) -> dict[str, float]:
        """The group statistics every world logs (:func:`group_metrics`), as the step's groups were before the
        curator observed them."""
        return dict(self.metrics) if self.metrics is not None else group_metrics(self.sampled, self.trained)


def group_metrics(sampled: list[Group], trained: list[Group]) -> dict[str, float]:
    """Mean sampled reward, the outcome shares of the sampled groups (``effective_prompt_ratio`` = mixed,
    ``frac_all_right``, ``frac_all_wrong``) and how many groups were trained and mixed."""
    rewards = np.concatenate([g.rewards for g in sampled if g.size] or [np.zeros(0)])
    shares = outcome_shares([g.rewards for g in sampled if g.size])
    return {"reward_mean": float(rewards.mean()) if rewards.size else 0.0,
            "effective_prompt_ratio": shares["mixed"],
            "frac_all_right": shares["always_right"],
            "frac_all_wrong": shares["always_wrong"],
            "groups_trained": len(trained),
            "groups_trained_mixed": int(sum(g.mixed for g in trained))}


def run_step(curator: Curator, ctx: StepContext, policy: "Policy", advantage: str, adv_eps: float) -> StepOutcome:
    """Run one step of ``curator`` with ``policy`` (see the module docstring)."""
    t0 = time.perf_counter()
    indices = curator.select(ctx)
    sampled = curator.rollout(ctx, indices)
    sampled, nonfinite = drop_nonfinite_rewards(ctx, sampled)
    trained = curator.process(ctx, sampled)
    t1 = time.perf_counter()
    advantages = [group_advantages(g, advantage, adv_eps) for g in trained]
    update = policy.update(trained, advantages)
    metrics = group_metrics(sampled, trained)
    groups = sampled + trained
    before = [_group_fields(g) for g in groups]
    curator.observe(ctx, trained)
    changed = next(((g, f) for g, was in zip(groups, before)
                    if not _unchanged(was, now := _group_fields(g)) and (f := _changed_field(was, now))), None)
    if changed is not None:  # the logs, the advantages and the next steps would read values that were not scored
        raise StrategyError(f"curator {curator.name!r}: observe changed the {changed[1]} of the group of prompt "
                           f"{changed[0].problem.uid!r}; observe reads the step's groups and writes none "
                           f"(rlcurate/curation/README.md)")
    if not curator.state_checked:  # at the first step, not at the first checkpoint after it
        curator.check_state()
    return StepOutcome(sampled, trained, advantages, update, ctx.counters, t1 - t0, time.perf_counter() - t1,
                       nonfinite, metrics)


_OBSERVED_FIELDS = ("rewards", "completions", "weight", "baseline", "pool_successes", "pool_size", "hint_level",
                    "generated", "generated_tokens")


def _group_fields(g: Group) -> tuple:
    """The values of :data:`_OBSERVED_FIELDS` (the rewards by their bytes, the completions by their number):
    a tuple that compares equal in one step when nothing changed, the common case."""
    rewards = np.asarray(g.rewards)
    return ((rewards.dtype.str, rewards.tobytes()), len(g.completions), *(getattr(g, f) for f in _OBSERVED_FIELDS[2:]))


def _unchanged(before: tuple, after: tuple) -> bool:
    """Whether two :func:`_group_fields` tuples are equal, in one comparison (False when a strategy left an array
    where a number belongs: :func:`_changed_field` compares those field by field)."""
    try:
        return bool(before == after)
    except ValueError:
        return False


def _changed_field(before: tuple, after: tuple) -> str | None:
    """The first field of :data:`_OBSERVED_FIELDS` whose value differs between two :func:`_group_fields`."""
    return next((f for f, a, b in zip(_OBSERVED_FIELDS, before, after) if not _same(a, b)), None)


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (arrays element by element)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return a == b or (a != a and b != b)


def drop_nonfinite_rewards(ctx: StepContext, sampled: list[Group]) -> tuple[list[Group], int]:
    """Leave out the groups holding a NaN or infinite reward (a broken verifier): they would turn the
    advantages, the loss and then the weights into NaN, and the curator's beliefs with them. Returns
    the rest and the number of such rollouts, which is logged."""
    bad = [g for g in sampled if g.size and not np.isfinite(g.rewards).all()]
    if not bad:
        return sampled, 0
    n = sum(int((~np.isfinite(g.rewards)).sum()) for g in bad)
    log.warning("step %d: %d rollout(s) of %d prompt(s) got a non-finite reward from task %r (first: %s, "
                "reward %r); those groups are left out of this step", ctx.step + 1, n, len(bad),
                getattr(ctx.task, "name", ctx.task), bad[0].problem.uid,
                next(float(r) for r in bad[0].rewards if not np.isfinite(r)))
    ids = {id(g) for g in bad}
    ctx.generated_groups[:] = [g for g in ctx.generated_groups if id(g) not in ids]
    return [g for g in sampled if id(g) not in ids], n
