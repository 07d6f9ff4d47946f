"""GRESO, GRPO with efficient selective rollout (Zheng et al., 2025, arXiv 2506.02177), chapter 11,
*When does curation pay?*: skip, before any rollout, the prompts whose recent history predicts a group
with zero variance, on top of DAPO's dynamic sampling (chapter 6).

The rule (the official code, ``Infini-AI-Lab/GRESO``, ``verl/trainer/ttis/presampling_selector.py``;
read in ``data/specs/greso_knapsack.md``, part A). A prompt's history is its visits; let c_e be the
number of its latest consecutive visits whose rollouts were all right, c_h all wrong (only one of the
two is non-zero). A prompt never rolled out is kept; otherwise it is skipped with probability

    1 - max(p_easy^c_e, 0.01)   (all right lately),   1 - max(p_hard^c_h, 0.01)   (all wrong lately),

so a prompt zero-variance at its last c visits is still explored with probability p^c, at least 1 %. A
skipped prompt is passed over for this pass over the pool, its history unchanged. After every step of
the second pass on, the shares of all-right and all-wrong groups among those rolled out move the base
probabilities by 0.01 towards targets of 1/3 and 2/3 of ``target_zero_variance`` (0.25: more
exploration for hard prompts, which may become solvable), clamped to [0.05, 0.95].

Dynamic sampling with an adaptive batch: the first generation batch has ``sampling_factor`` x B prompts
(1.5 B in the scripts: 384 for B = 256); while fewer than B groups are mixed, the next batch has
int(1.25 x (rollouts still needed) / (1 - zvr) / n) prompts, zvr the zero-variance share of the batch
just rolled out, at least B / 4 (64 of 256) and at most the first batch's size; a batch whose estimate
fits in the first batch's size is the last. The first B mixed groups are trained (DAPO's filter).

Deliberate differences, each named: binary rewards, so "all right" and "all wrong" replace the official
thresholds mean >= 0.98 and mean <= 0.11 of its {0, 0.1, 1} rewards (the spec's recommendation); at most
``max_num_gen_batches`` generation batches per step (the official loop has no cap; a pool with no mixed
prompt would never stop) and a batch of zero-variance prompts only (zvr = 1, where the official code
divides by zero) is followed by a full-size one; prompts are not truncated to a multiple of the GPU
count; the surplus of an over-full step is not carried over. The published gains are against DAPO's
dynamic sampling, not GRPO: up to 3.35x fewer rollouts at equal accuracy (the project blog), up to 2.4x
less rollout wall time (the abstract).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlcurate.curation.ada_seq import _int_at_least
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.dapo import DapoFilter
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.seeding import named_stream

__all__ = ["skip_probability", "adapt", "next_batch_size", "GresoSelector", "GresoSampler", "GresoConfig"]

log = logging.getLogger(__name__)

EXPLORATION_FLOOR = 0.01
STEP = 0.01


def skip_probability(easy_run: int, hard_run: int, p_easy: float, p_hard: float) -> float:
    """The chance a prompt is skipped: 1 - max(p^c, 0.01) for its run c of all-right (p_easy) or
    all-wrong (p_hard) latest visits; 0 without such a run."""
    if easy_run > 0:
        return 1.0 - max(p_easy ** easy_run, EXPLORATION_FLOOR)
    if hard_run > 0:
        return 1.0 - max(p_hard ** hard_run, EXPLORATION_FLOOR)
    return 0.0


def adapt(p: float, observed_share: float, target_share: float, lo: float = 0.05, hi: float = 0.95) -> float:
    """One step of the base probability's adaptation: down by 0.01 when the observed zero-variance share
    of its kind reaches the target (skip more), else up, clamped to [lo, hi]."""
    p = p - STEP if observed_share >= target_share else p + STEP
    return min(max(p, lo), hi)


def next_batch_size(still_needed: int, zvr: float, group_size: int, default: int, floor: int) -> tuple[int, bool]:
    """(prompts of the next generation batch, whether it is the last): est = int(still_needed / (1 - zvr)
    / group_size * 1.25), at most ``default``, at least ``floor``; the last when est fits in ``default``.
    A batch of zero-variance prompts only (zvr = 1) gives a full-size batch that is not the last."""
    if zvr >= 1.0:
        return default, False
    est = int(still_needed / (1.0 - zvr) / group_size * 1.25)
    return max(min(est, default), floor), est <= default


class GresoSelector(Selector):
    """The epoch order, passing over each prompt with its skip probability (module docstring); learns
    the runs and adapts p_easy, p_hard from every group generated in a step."""

    name = "greso"

    def __init__(self, p_easy: float = 0.5, p_hard: float = 0.5, target_zero_variance: float = 0.25,
                 min_p: float = 0.05, max_p: float = 0.95):
        super().__init__()
        for key, v in (("p_easy", p_easy), ("p_hard", p_hard), ("min_p", min_p), ("max_p", max_p)):
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{key} must lie in [0, 1], got {v!r}")
        if not 0.0 < float(target_zero_variance) < 1.0:
            raise ValueError(f"target_zero_variance must lie in (0, 1), got {target_zero_variance!r}")
        self.p_easy, self.p_hard = float(p_easy), float(p_hard)
        self.target = float(target_zero_variance)
        self.min_p, self.max_p = float(min_p), float(max_p)
        self.runs: dict[int, tuple[int, int]] = {}  # pool index -> (all-right run, all-wrong run)
        self.skipped = {"easy": 0, "hard": 0}
        self.draws = 0
        self.last = {"easy": 0.0, "hard": 0.0}

    def draw(self, k: int) -> list[int]:
        out: list[int] = []
        passed = 0
        while len(out) < k:
            i = super().draw(1)[0]
            self.draws += 1
            e, h = self.runs.get(i, (0, 0))
            s = skip_probability(e, h, self.p_easy, self.p_hard)
            if s > 0 and passed < self.n_items and named_stream("greso_skip", self.seed, self.draws).random() < s:
                passed += 1
                self.skipped["easy" if e else "hard"] += 1
                continue
            out.append(i)
        return out

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        rolled = [g for g in ctx.generated_groups if g.size]
        for g in rolled:
            e, h = self.runs.get(g.index, (0, 0))
            right, wrong = bool(np.all(g.rewards >= 1.0)), bool(np.all(g.rewards <= 0.0))
            self.runs[g.index] = (e + 1 if right else 0, h + 1 if wrong else 0)
        if rolled:
            easy = float(np.mean([np.all(g.rewards >= 1.0) for g in rolled]))
            hard = float(np.mean([np.all(g.rewards <= 0.0) for g in rolled]))
            self.last = {"easy": easy, "hard": hard}
            if self.epoch > 0:
                self.p_easy = adapt(self.p_easy, easy, self.target / 3, self.min_p, self.max_p)
                self.p_hard = adapt(self.p_hard, hard, 2 * self.target / 3, self.min_p, self.max_p)

    def metrics(self) -> dict[str, float]:
        return {"greso_p_easy": self.p_easy, "greso_p_hard": self.p_hard, "greso_skipped_easy": self.skipped["easy"],
                "greso_skipped_hard": self.skipped["hard"], "greso_all_right": self.last["easy"],
                "greso_all_wrong": self.last["hard"]}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "p_easy": self.p_easy, "p_hard": self.p_hard, "draws": self.draws,
                "skipped": dict(self.skipped), "runs": [[i, e, h] for i, (e, h) in sorted(self.runs.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.p_easy, self.p_hard, self.draws = float(state["p_easy"]), float(state["p_hard"]), int(state["draws"])
        self.skipped = {k: int(v) for k, v in state["skipped"].items()}
        self.runs = {int(i): (int(e), int(h)) for i, e, h in state["runs"]}


class GresoSampler(Sampler):
    """Dynamic sampling with GRESO's adaptive generation batch (module docstring); returns every
    generated group, the filter keeps the first B mixed ones."""

    name = "greso_dynamic"

    def __init__(self, sampling_factor: float = 1.5, max_num_gen_batches: int = 10):
        if not float(sampling_factor) >= 1.0:
            raise ValueError(f"sampling_factor must be at least 1, got {sampling_factor!r}")
        self.sampling_factor = float(sampling_factor)
        self.max_num_gen_batches = _int_at_least("max_num_gen_batches", max_num_gen_batches, 1)
        self.last = {"batches": 0, "mixed": 0}

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        B, n = ctx.prompts_per_step, ctx.group_size
        default = max(B, int(round(self.sampling_factor * B)))
        floor = max(1, math.ceil(B / 4))
        first = list(indices) + (ctx.more_prompts(default - len(indices)) if default > len(indices) else [])
        batch = ctx.generate(first, n)
        groups, batches, last = list(batch), 1, False
        mixed = sum(g.mixed for g in groups)
        while mixed < B and not last and batches < self.max_num_gen_batches:
            zvr = 1.0 - float(np.mean([g.mixed for g in batch])) if batch else 1.0
            size, last = next_batch_size((B - mixed) * n, zvr, n, default, floor)
            batch = ctx.generate(ctx.more_prompts(size), n)
            groups.extend(batch)
            mixed += sum(g.mixed for g in batch)
            batches += 1
        self.last = {"batches": batches, "mixed": mixed}
        return groups

    def metrics(self) -> dict[str, float]:
        return {"greso_gen_batches": self.last["batches"], "greso_mixed": self.last["mixed"]}


@register("greso")
@dataclass
class GresoConfig(StrategyConfig):
    """GRESO (Zheng et al., 2025; chapter 11): skip before rollout a prompt whose last c visits were all
    right (all wrong) with probability 1 - max(p^c, 0.01), p adapted towards a zero-variance target, on
    top of DAPO's dynamic sampling with an adaptive generation batch."""

    p_easy: float = 0.5
    """Initial exploration base of prompts all right lately."""
    p_hard: float = 0.5
    """Initial exploration base of prompts all wrong lately."""
    target_zero_variance: float = 0.25
    """Zero-variance share aimed at among rolled-out prompts (1/3 of it all right, 2/3 all wrong)."""
    min_p: float = 0.05
    """Lower clamp of the bases."""
    max_p: float = 0.95
    """Upper clamp of the bases."""
    sampling_factor: float = 1.5
    """Prompts of the first generation batch per trained prompt (the scripts' 384 / 256)."""
    max_num_gen_batches: int = 10
    """Cap on generation batches per step (none in the official code)."""

    def build(self) -> Curator:
        return Curator(GresoSelector(self.p_easy, self.p_hard, self.target_zero_variance, self.min_p, self.max_p),
                       GresoSampler(self.sampling_factor, self.max_num_gen_batches), [DapoFilter()], name=self.name)
