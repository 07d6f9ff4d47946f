"""Pilot-Commit (Kim, Yang, Yan and Liu, 2026, arXiv 2605.26606), chapter 11, *When does curation pay?*:
a few pilot rollouts per prompt decide where the many commit rollouts go.

The official code (``databricks/pilot-commit``, ``recipe/pc/pc_ray_trainer.py`` and
``recipe/pc/replay_buffer.py``; read in ``data/specs/pilot_commit.md``) runs *sampling rounds*. Each
round

1. pilots ``pilot_factor`` x B' fresh prompts of the pass over the pool with ``n_pilot`` rollouts each
   (3 B' and 16 or 32 in the scripts; B' the prompts trained per step);
2. in the same generation, commits ``n_commit`` rollouts (48 or 96) to each of min(B' - trained so far,
   buffer size) prompts taken from a buffer of prompts an *earlier* round accepted (at random, or the
   largest pilot variance first, ``buffer_sampling``); a committed prompt leaves the buffer;
3. decides on this round's pilots from p_hat = successes / ``n_pilot``: commit iff
   ``lower`` <= p_hat <= 1 - ``upper`` (0.125 and 0.25: skip above 0.75, defer below 0.125, both ends
   kept); an accepted prompt enters the buffer with its pilot rollouts, the others' pilots are dropped;
   a prompt with p_hat >= ``exclude`` (1.0: every pilot right) leaves the pool from the next pass on;
4. trains, once B' prompts are committed, on each committed prompt's stored pilots and fresh commits as
   one GRPO group of ``n_pilot + n_commit`` (the stored pilots may be up to ``max_off_steps`` + 1
   updates old; their log-probabilities are recomputed under the current policy, no importance
   correction, as in the official trainer);
5. after the step, drops buffer entries more than ``max_off_steps`` (4) steps old.

A deferred ("too hard") or skipped prompt simply waits for the next pass, where it is piloted again;
there is no deferral queue. Every generated rollout is charged, pilots of rejected prompts included
(the official counters' ``num_rollouts_sample``; what the paper's "cumulative rollouts" counts could
not be read). In the scripts B' x (n_pilot + n_commit) equals the GRPO baseline's B x n (the trained
batch is the same, generation is 1.5x); here ``train_prompts`` defaults to B x ``group_size`` /
(n_pilot + n_commit) for the same reason.

Deliberate differences, each named: a step that finds fewer than B' prompts in ``max_rounds`` rounds
trains on what it found (the official code raises an error); the buffer is not emptied at the end of a
pass over the pool (its staleness limit bounds it anyway); no rounding of the commit count to the GPU
count. Published: cumulative rollouts to a target accuracy 1.5x fewer than GRPO's (1.5B, 4B, 8B),
1.9x (14B), and 2.3x-4.0x fewer than DAPO's.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlcurate.curation.ada_seq import _int_at_least
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["pilot_decision", "stale", "PilotCommitSelector", "PilotCommitSampler", "PilotCommitConfig"]

log = logging.getLogger(__name__)

BUFFER_SAMPLING = ("random", "max_variance")


def pilot_decision(p_hat: float, lower: float = 0.125, upper: float = 0.25) -> str:
    """``"commit"`` iff lower <= p_hat <= 1 - upper, ``"skip"`` above (too easy), ``"defer"`` below
    (too hard); both boundaries commit."""
    if p_hat > 1.0 - upper:
        return "skip"
    if p_hat < lower:
        return "defer"
    return "commit"


def stale(added_at: int, step: int, max_off_steps: int) -> bool:
    """Whether a buffer entry added at step ``added_at`` is dropped by the flush after step ``step``."""
    return step - added_at > max_off_steps


class PilotCommitSelector(Selector):
    """The pass over the pool without the prompts excluded (all pilots right); ``select`` returns the
    first round's pilot prompts (the sampler asks for the later rounds')."""

    name = "pilot_commit"

    def __init__(self, pilots_per_round):
        super().__init__()
        self.pilots_per_round = pilots_per_round  # (ctx) -> pilot prompts per round, the sampler's rule
        self.excluded: set[int] = set()
        self.marked: set[int] = set()  # excluded from the next pass on
        self.excluded_in = 0  # the pass whose order ``excluded`` applies to

    def _epoch_order(self) -> np.ndarray:
        if self.epoch != self.excluded_in:  # a new pass (not a resumed one): this pass's marks apply
            self.excluded |= self.marked
            self.marked, self.excluded_in = set(), self.epoch
        order = super()._epoch_order()
        kept = order[~np.isin(order, list(self.excluded))] if self.excluded else order
        return kept if kept.size else order  # every prompt solved: the whole pool again

    def select(self, ctx: StepContext, k: int) -> list[int]:
        return self.draw(self.pilots_per_round(ctx))

    def metrics(self) -> dict[str, float]:
        return {"pc_excluded": len(self.excluded)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "excluded": sorted(self.excluded), "marked": sorted(self.marked),
                "excluded_in": self.excluded_in}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.excluded, self.marked = set(state["excluded"]), set(state["marked"])
        self.excluded_in = int(state["excluded_in"])


class PilotCommitSampler(Sampler):
    """The rounds of the module docstring; ``selector`` is the strategy's own (it keeps the exclusions). As the
    sampler of a composition (``a+pilot_commit``) it pilots what selector ``a`` gives (``ctx.more_prompts``) and
    its exclusions reach no selector: the pool is not shrunk."""

    name = "pilot_commit"

    def __init__(self, selector: PilotCommitSelector, n_pilot: int = 16, n_commit: int = 48,
                 lower: float = 0.125, upper: float = 0.25, exclude: float | None = 1.0, pilot_factor: int = 3,
                 train_prompts: int | None = None, max_rounds: int = 10, max_off_steps: int = 4,
                 buffer_sampling: str = "random"):
        self.selector = selector
        self.n_pilot = _int_at_least("n_pilot", n_pilot, 1)
        self.n_commit = _int_at_least("n_commit", n_commit, 1)
        if not (0.0 <= float(lower) <= 1.0 and 0.0 <= float(upper) <= 1.0 and lower <= 1.0 - upper):
            raise ValueError(f"lower and upper must satisfy 0 <= lower <= 1 - upper <= 1, got {lower!r} and {upper!r}")
        if exclude is not None and not 0.0 < float(exclude) <= 1.0:
            raise ValueError(f"exclude must lie in (0, 1] or be None, got {exclude!r}")
        if buffer_sampling not in BUFFER_SAMPLING:
            raise ValueError(f"buffer_sampling must be one of {', '.join(BUFFER_SAMPLING)}, got {buffer_sampling!r}")
        self.lower, self.upper = float(lower), float(upper)
        self.exclude = None if exclude is None else float(exclude)
        self.pilot_factor = _int_at_least("pilot_factor", pilot_factor, 1)
        self.train_prompts = None if train_prompts is None else _int_at_least("train_prompts", train_prompts, 1)
        self.max_rounds = _int_at_least("max_rounds", max_rounds, 1)
        self.max_off_steps = _int_at_least("max_off_steps", max_off_steps, 0)
        self.buffer_sampling = buffer_sampling
        self.buffer: dict[int, tuple[Group, int]] = {}  # pool index -> (pilot group, step added)
        self._restored: list[dict] = []
        self.last: dict[str, float] = {}

    def trained_prompts(self, ctx: StepContext) -> int:
        """B': the prompts trained per step (default: uniform's trained rollouts over the group size)."""
        if self.train_prompts is not None:
            return self.train_prompts
        return max(1, round(ctx.prompts_per_step * ctx.group_size / (self.n_pilot + self.n_commit)))

    def pilots_per_round(self, ctx: StepContext) -> int:
        return self.pilot_factor * self.trained_prompts(ctx)

    def take(self, ctx: StepContext, c: int) -> list[int]:
        """``c`` buffered prompts (all of them when the buffer holds no more), removed from the buffer."""
        keys = list(self.buffer)
        if c >= len(keys):
            chosen = keys
        elif self.buffer_sampling == "random":
            chosen = [keys[j] for j in ctx.rng.choice(len(keys), size=c, replace=False)]
        else:  # the largest pilot std first (p_hat nearest 1/2), then the newest
            chosen = sorted(keys, key=lambda i: (float(np.std(self.buffer[i][0].rewards)), self.buffer[i][1]),
                            reverse=True)[:c]
        return chosen

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        self._rebuild(ctx)
        want = self.trained_prompts(ctx)
        trained: list[Group] = []
        counts = {"commit": 0, "skip": 0, "defer": 0}
        fresh, rounds = list(indices), 0
        while True:
            rounds += 1
            committed = self.take(ctx, min(want - len(trained), len(self.buffer)))
            pilots = ctx.generate(fresh, self.n_pilot)
            commits = ctx.generate(committed, self.n_commit) if committed else []
            for i, g in zip(committed, commits):
                pilot, _ = self.buffer.pop(i)
                merged = pilot.merge(g)
                merged.generated, merged.generated_tokens = g.generated, g.generated_tokens  # pilots: charged earlier
                trained.append(merged)
            for g in pilots:
                p_hat = float(np.mean(g.rewards >= 1.0))
                decision = pilot_decision(p_hat, self.lower, self.upper)
                counts[decision] += 1
                if decision == "commit":
                    self.buffer[g.index] = (g, ctx.step)
                if self.exclude is not None and p_hat >= self.exclude:
                    self.selector.marked.add(g.index)
            if len(trained) >= want or rounds >= self.max_rounds:
                break
            fresh = ctx.more_prompts(self.pilots_per_round(ctx))
        if len(trained) < want:
            log.warning("pilot_commit: step %d committed %d of the %d prompts wanted in %d rounds; training on "
                        "what was found", ctx.step, len(trained), want, rounds)
        for i in [i for i, (_, added) in self.buffer.items() if stale(added, ctx.step, self.max_off_steps)]:
            del self.buffer[i]
        n = max(1, sum(counts.values()))
        self.last = {"pc_rounds": rounds, "pc_committed": len(trained), "pc_buffer": len(self.buffer),
                     "pc_accept_share": counts["commit"] / n, "pc_skip_share": counts["skip"] / n,
                     "pc_defer_share": counts["defer"] / n}
        return trained

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [{"index": i, "added": added, "prompt": g.prompt, "rewards": g.rewards.tolist(),
                            "reasons": list(g.reasons), "generated": g.generated, "generated_tokens": g.generated_tokens,
                            "completions": [asdict(c) for c in g.completions]}
                           for i, (g, added) in self.buffer.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored = list(state["buffer"])  # Groups need the pool's problems: rebuilt at the next step
        self.buffer = {}

    def _rebuild(self, ctx: StepContext) -> None:
        from rlcurate.rollout.base import Completion

        for e in self._restored:
            self.buffer[int(e["index"])] = (Group(
                int(e["index"]), ctx.problems[int(e["index"])], e["prompt"], [Completion(**c) for c in e["completions"]],
                np.array(e["rewards"], dtype=float), list(e["reasons"]), generated=int(e["generated"]),
                generated_tokens=int(e["generated_tokens"])), int(e["added"]))
        self._restored = []


@register("pilot_commit")
@dataclass
class PilotCommitConfig(StrategyConfig):
    """Pilot-Commit (Kim et al., 2026; chapter 11): pilot ``n_pilot`` rollouts on 3 B' fresh prompts per
    round, skip those with p_hat > 0.75 and defer those below 0.125 to the next pass, commit ``n_commit``
    more rollouts to buffered accepted prompts in a later round and train pilots and commits as one group."""

    n_pilot: int = 16
    """Pilot rollouts per prompt (the 4B script; 32 for 1.5B)."""
    n_commit: int = 48
    """Commit rollouts per accepted prompt (the 4B script; 96 for 1.5B)."""
    lower: float = 0.125
    """Defer a prompt whose pilot pass rate is below this."""
    upper: float = 0.25
    """Skip a prompt whose pilot pass rate is above 1 - upper (a distance from 1, as in the official code)."""
    exclude: float | None = 1.0
    """Leave a prompt out of later passes once its pilot pass rate reaches this (``None``: never)."""
    pilot_factor: int = 3
    """Fresh prompts piloted per round per trained prompt (the scripts' 384 / 128)."""
    train_prompts: int | None = None
    """B', prompts trained per step (``None``: B x group_size / (n_pilot + n_commit), uniform's trained rollouts)."""
    max_rounds: int = 10
    """Sampling rounds per step at most."""
    max_off_steps: int = 4
    """A buffered pilot older than this many steps is dropped."""
    buffer_sampling: str = "random"
    """Which buffered prompts are committed: ``random`` (4B script) or ``max_variance`` (1.5B script)."""

    def build(self) -> Curator:
        sampler = PilotCommitSampler(None, self.n_pilot, self.n_commit, self.lower, self.upper, self.exclude,
                                     self.pilot_factor, self.train_prompts, self.max_rounds, self.max_off_steps,
                                     self.buffer_sampling)
        sampler.selector = PilotCommitSelector(sampler.pilots_per_round)
        return Curator(sampler.selector, sampler, name=self.name)
