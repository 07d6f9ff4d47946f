"""Hinting collapsed prompts: SAGE and SAGE-LIGHT (Liao et al., 2026; chapter 7, *Hinting*).

A group whose G rewards are all zero has no positive, every standardised advantage is zero and the
prompt teaches nothing (the gate of chapter 1 is shut). SAGE changes the *input* instead of the
sampling: it conditions the policy on a training-only hint h distilled from the reference solution,
which raises p_theta(x, h) toward the regime where u(p) = 1 - (1 - p)^G - p^G is large, and trains on
the hinted rollouts on-policy in (x, h). Deployment and evaluation use no hint.

``sage`` (the paper's Algorithm 1; the code's ``method="sage"``), per prompt and step:

1. roll out G completions at hint level 0; if some reward is positive (or the prompt has no reference
   solution), that group is trained;
2. otherwise (collapse z(x) = 1[sum_i r_i = 0]; all-correct groups are *not* hinted) get the prompt's
   three hints once, then re-roll G completions at level 1, then 2, then 3, stopping at the first level
   whose group has a positive reward;
3. the last level's group replaces the level-0 group, kept even if it is still all zero. Its
   ``prompt`` is the hinted prompt text (``ctx.generate`` renders it), so the trainer's log-probs are
   log pi(y | x, h); ``hint_level`` records the level.

One hint per prompt per step, shared by all G rollouts (Jensen on the concave u: mixing hints lowers
E_h u(p(x, h)), the paper's Remark 3.4).

What a level costs (``regenerate``). By default (``"collapsed"``, the paper's Algorithm 1) a level
rolls out only the prompts still collapsed: a step costs G (B + sum over levels of the prompts still
collapsed) rollouts. The released code (BaohaoLiao/SAGE ``recipe/hint/hint_trainer.py``) instead
re-runs the whole batch at every level that some prompt still needs, B x G rollouts, the others
unhinted, and keeps only the hinted groups: B G (1 + levels run) rollouts per step.
``regenerate="all"`` does the same (the discarded groups are generated, counted as compute and, being
unhinted, seen by belief selectors with ``evidence="generated"``); the trained groups do not change
in law, only the bill: with c_l the share of the step's prompts still collapsed before level l, the
code's step costs (1 + #{l: c_l > 0}) / (1 + sum_l c_l) times the paper's.

``sage_light`` (the paper's cheaper variant): no level-0 probe. Each prompt keeps a hint level from
its previous visit and is rolled out once, at that level. The code's rule (the default, ``rule="code"``):
level + 1 (at most 3) when the previous visit's accuracy was <= ``min_threshold`` (0.1 in the
released run script, 0.0 in its yaml), level - 1 (at least 0) when it was > ``max_threshold`` (0.35),
unchanged in between. The paper's rule (``rule="paper"``): level + 1 (at most 3) when the previous
accuracy was < alpha = 0.35; the paper says nothing about lowering the level, so here it stays. The
first visit has no hint.

Where hints come from (``hint_source``: the task's own ``hint`` method, or hints the policy writes
itself with the paper's hint prompt, counted as generated tokens): :mod:`rlcurate.curation.sage_hints`.

What a hint may say and where it goes (``hint_mode``, both variants; the rule:
:mod:`rlcurate.tasks.hints`). ``"user"`` is SAGE's own rule: the hint is placed in the user turn
and never contains the final answer (task hints: the reference steps, never the last one and none
from the first step that states the answer on; self-written hints: cut before the sentence that
states it). ``"prefix"`` is the contrast, partial-solution prefixing: the first ``level`` reference
steps start the assistant turn, and at a level as high as the number of steps the whole solution is
given. The default ``"auto"`` is what earlier versions did (the tiny arithmetic task: ``"prefix"``;
self-written hints: user turn, no answer guard); it is kept as the default so that the committed
reference runs, made with it, stay valid. Set ``hint_mode: user`` for SAGE's rule.

For belief-based selectors (chapter 9) a rescued SAGE group carries its unhinted evidence in
``pool_successes`` / ``pool_size`` (the level-0 group: 0 of G); SAGE-LIGHT's hinted groups carry none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlcurate._validate import as_probability
from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.curation.sage_hints import (
    HINT_MODES,
    HINT_SYSTEM_PROMPT,
    HINT_USER_TEMPLATE,
    MAX_LEVEL,
    HintSource,
    fallback_hints,
    parse_hint_payload,
    render_hint_request,
)

__all__ = ["HINT_MODES", "HINT_SYSTEM_PROMPT", "HINT_USER_TEMPLATE", "MAX_LEVEL", "HintSource", "SageSampler",
           "SageLightSampler", "parse_hint_payload", "fallback_hints", "render_hint_request", "next_level_code",
           "next_level_paper", "SageConfig", "SageLightConfig"]


def _positive(group: Group, threshold: float) -> bool:
    return group.size > 0 and float(np.max(group.rewards)) > threshold


# ----------------------------------------------------------------------------------------------
# SAGE
# ----------------------------------------------------------------------------------------------


class SageSampler(Sampler):
    """SAGE's rollout (chapter 7): level 0, then escalate collapsed prompts through hint levels 1..3
    until a group has a positive reward; see the module docstring.

    Args:
        max_level: L, the strongest hint level (3).
        positive_threshold: a reward > this is a positive (0: any non-zero reward, as the paper's
            collapse indicator 1[sum_i r_i = 0]).
        hint_source, max_retries, hint_max_new_tokens: see :class:`HintSource`.
        regenerate: ``"collapsed"`` (default: each level rolls out the prompts still collapsed) or
            ``"all"`` (the released code: each level re-runs every prompt of the step and keeps the
            hinted groups); see the module docstring.
        hint_mode: ``"auto"`` (default, earlier versions' hints), ``"prefix"`` or ``"user"`` (SAGE's
            rule); see the module docstring.

    ``last_stats`` after each step: prompts collapsed at level 0, prompts rolled out at each level,
    prompts rescued (a positive at some level).
    """

    name = "sage"

    def __init__(self, max_level: int = MAX_LEVEL, positive_threshold: float = 0.0, hint_source: str = "auto",
                 max_retries: int = 3, hint_max_new_tokens: int = 512, regenerate: str = "collapsed",
                 hint_mode: str = "auto"):
        if regenerate not in ("collapsed", "all"):
            raise ValueError(f"regenerate must be 'collapsed' or 'all', got {regenerate!r}")
        self.regenerate = regenerate
        self.max_level = int(max_level)
        self.positive_threshold = float(positive_threshold)
        self.hints = HintSource(hint_source, self.max_level, max_retries, hint_max_new_tokens, hint_mode)
        self.hint_mode = hint_mode
        self.last_stats: dict[str, Any] = {}

    def check_task(self, task) -> None:
        """Refuse a ``hint_mode`` the task cannot place (``ValueError``; the trainer calls it before the
        model loads)."""
        self.hints.check_task(task)

    def metrics(self) -> dict[str, float]:
        st = self.last_stats or {}
        levels = st.get("rolled_at_level", [])
        out = {"sage_collapsed": st.get("collapsed", 0), "sage_rescued": st.get("rescued", 0)}
        out.update({f"sage_rolled_level{lv}": n for lv, n in enumerate(levels)})
        if self.hint_mode == "user":  # self-written hint levels cut for stating the answer, so far
            out["sage_hint_levels_cut"] = self.hints.cut
        return out

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        self.hints.check_task(ctx.task)
        mode = self.hints.render_mode
        G = ctx.group_size
        groups = ctx.generate(indices, G)
        collapsed = [k for k, g in enumerate(groups) if g.size and not _positive(g, self.positive_threshold)]
        stats = {"collapsed": len(collapsed), "rolled_at_level": [len(groups)] + [0] * self.max_level,
                 "rescued": 0}
        self.last_stats = stats
        if not collapsed:
            return groups
        hints = self.hints.hints(ctx, [indices[k] for k in collapsed])
        level0 = {k: groups[k] for k in collapsed}
        spent = {k: (groups[k].generated, groups[k].generated_tokens) for k in collapsed}
        active = [k for k in collapsed if any(hints[indices[k]].get(lv) for lv in range(1, self.max_level + 1))]
        for level in range(1, self.max_level + 1):
            todo = [k for k in active if hints[indices[k]].get(level)]
            if not todo:
                continue
            if self.regenerate == "all":  # the released code: the whole batch again, hinted where needed
                want = set(todo)
                every = ctx.generate(indices, G, hints=[hints[indices[k]][level] if k in want else None
                                                        for k in range(len(indices))],
                                     hint_levels=[level if k in want else 0 for k in range(len(indices))],
                                     hint_mode=mode)
                new = [every[k] for k in todo]
                for k, g in enumerate(every):
                    if k in want:
                        continue
                    if k in spent:
                        gen, tok = spent[k]
                        spent[k] = (gen + g.generated, tok + g.generated_tokens)
                    else:
                        groups[k].generated += g.generated
                        groups[k].generated_tokens += g.generated_tokens
                stats["rolled_at_level"][level] = len(indices)
            else:
                new = ctx.generate([indices[k] for k in todo], G, hints=[hints[indices[k]][level] for k in todo],
                                   hint_levels=[level] * len(todo), hint_mode=mode)
                stats["rolled_at_level"][level] = len(todo)
            for k, g in zip(todo, new):
                gen, tok = spent[k]
                spent[k] = (gen + g.generated, tok + g.generated_tokens)
                groups[k] = g
            solved = {k for k, g in zip(todo, new) if _positive(g, self.positive_threshold)}
            stats["rescued"] += len(solved)
            active = [k for k in active if k not in solved]
            if not active:
                break
        for k in collapsed:
            g = groups[k]
            g.generated, g.generated_tokens = spent[k]
            g.generated_tokens += self.hints.tokens.get(indices[k], 0)
            if g.hint_level > 0:  # the unhinted evidence about this prompt: its level-0 group
                g.pool_successes = float(np.sum(level0[k].rewards > self.positive_threshold))
                g.pool_size = level0[k].size
        return groups


# ----------------------------------------------------------------------------------------------
# SAGE-LIGHT
# ----------------------------------------------------------------------------------------------


def next_level_code(level: int, prev_acc: float, min_threshold: float = 0.1, max_threshold: float = 0.35,
                    max_level: int = MAX_LEVEL) -> int:
    """SAGE-LIGHT's level update in the released code (chapter 7): +1 (at most ``max_level``) when
    the previous accuracy <= ``min_threshold``, -1 (at least 0) when it is > ``max_threshold``,
    unchanged otherwise (thresholds are swapped if given in the wrong order, as the code does)."""
    lo, hi = sorted((float(min_threshold), float(max_threshold)))
    if prev_acc <= lo:
        return min(level + 1, max_level)
    if prev_acc > hi:
        return max(level - 1, 0)
    return level


def next_level_paper(level: int, prev_acc: float, alpha: float = 0.35, max_level: int = MAX_LEVEL) -> int:
    """SAGE-LIGHT's level update as the paper states it (chapter 7): min(level + 1, L) when the
    previous accuracy < alpha; otherwise unchanged (the paper gives no rule for lowering)."""
    return min(level + 1, max_level) if prev_acc < alpha else level


class SageLightSampler(Sampler):
    """SAGE-LIGHT (chapter 7): one group per prompt at a hint level scheduled from the prompt's
    previous visit; see the module docstring.

    Args:
        rule: ``"code"`` (default) or ``"paper"``.
        min_threshold, max_threshold: the code's thresholds (0.1, 0.35).
        alpha: the paper's threshold (0.35).
        max_level, positive_threshold, hint_source, max_retries, hint_max_new_tokens, hint_mode: as for
            :class:`SageSampler`; the accuracy of a visit is the share of rewards > ``positive_threshold``.

    State (kept across steps, saved in checkpoints): per pool index, the level used and the accuracy
    reached at its last visit.
    """

    name = "sage_light"

    def __init__(self, rule: str = "code", min_threshold: float = 0.1, max_threshold: float = 0.35,
                 alpha: float = 0.35, max_level: int = MAX_LEVEL, positive_threshold: float = 0.0,
                 hint_source: str = "auto", max_retries: int = 3, hint_max_new_tokens: int = 512,
                 hint_mode: str = "auto"):
        if rule not in ("code", "paper"):
            raise ValueError(f"rule must be 'code' or 'paper', got {rule!r}")
        self.rule = rule
        self.min_threshold, self.max_threshold, self.alpha = (float(as_probability(v, n)) for v, n in (
            (min_threshold, "min_threshold"), (max_threshold, "max_threshold"), (alpha, "alpha")))
        self.max_level = int(max_level)
        self.positive_threshold = float(positive_threshold)
        self.hints = HintSource(hint_source, self.max_level, max_retries, hint_max_new_tokens, hint_mode)
        self.hint_mode = hint_mode
        self.last_level: dict[int, int] = {}
        self.last_acc: dict[int, float] = {}
        self.rolled_at_level: list[int] = []

    def check_task(self, task) -> None:
        """As :meth:`SageSampler.check_task`."""
        self.hints.check_task(task)

    def metrics(self) -> dict[str, float]:
        """Groups rolled at each hint level in the last step (as SAGE's ``sage_rolled_level{l}``)."""
        out = {f"sage_rolled_level{lv}": n for lv, n in enumerate(self.rolled_at_level)}
        if self.hint_mode == "user":
            out["sage_hint_levels_cut"] = self.hints.cut
        return out

    def scheduled_level(self, index: int) -> int:
        """The hint level of pool index ``index`` at its next visit (0 at the first)."""
        index = int(index)
        if index not in self.last_acc:
            return 0
        lv, acc = self.last_level.get(index, 0), self.last_acc[index]
        if self.rule == "code":
            return next_level_code(lv, acc, self.min_threshold, self.max_threshold, self.max_level)
        return next_level_paper(lv, acc, self.alpha, self.max_level)

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
        self.hints.check_task(ctx.task)
        levels = [self.scheduled_level(i) for i in indices]
        hinted = [i for i, lv in zip(indices, levels) if lv > 0]
        hints = self.hints.hints(ctx, hinted) if hinted else {}
        texts, used = [], []
        for i, lv in zip(indices, levels):
            text = hints[int(i)].get(lv, "") if lv > 0 else ""
            texts.append(text or None)
            used.append(lv if text else 0)  # no hint text (no reference solution): unhinted
        self.rolled_at_level = np.bincount(used, minlength=self.max_level + 1).tolist()
        groups = ctx.generate(indices, ctx.group_size, hints=texts, hint_levels=used, hint_mode=self.hints.render_mode)
        for i, g in zip(indices, groups):
            g.generated_tokens += self.hints.tokens.get(int(i), 0) if g.hint_level > 0 else 0
        return groups

    def observe(self, ctx: StepContext, groups: list[Group]) -> None:
        for g in groups:
            if not g.size:
                continue
            self.last_level[int(g.index)] = int(g.hint_level)
            self.last_acc[int(g.index)] = float(np.mean(g.rewards > self.positive_threshold))

    def state_dict(self) -> dict[str, Any]:
        # JSON turns int keys into strings: store rows [index, level, accuracy]
        return {"visits": [[i, self.last_level.get(i, 0), self.last_acc[i]] for i in sorted(self.last_acc)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_level = {int(i): int(lv) for i, lv, _ in state.get("visits", [])}
        self.last_acc = {int(i): float(a) for i, _, a in state.get("visits", [])}


# ----------------------------------------------------------------------------------------------
# Registered strategies
# ----------------------------------------------------------------------------------------------


@dataclass
class _HintOptions(StrategyConfig):
    """The options both SAGE variants take (chapter 7)."""

    max_level: int = MAX_LEVEL
    """L, the strongest hint level (3)."""
    positive_threshold: float = 0.0
    """A reward above this is a positive (0: any non-zero reward, the paper's collapse indicator)."""
    hint_source: str = "auto"
    """``"task"`` (the task's ``hint`` method), ``"self"`` (the policy writes the hints from the
    reference solution) or ``"auto"`` (``"task"`` when the task has hints)."""
    max_retries: int = 3
    """Self-hinting: generations per prompt until the hints parse (then reference steps are revealed)."""
    hint_max_new_tokens: int = 512
    """Self-hinting: longest hint answer in tokens."""
    hint_mode: str = "auto"
    """What a hint may say and where it goes: ``"user"`` (SAGE's rule: in the user turn, never the final
    answer; task hints show at most all reference steps but the last, none from the first step that
    states the answer; self-written hints are cut before the sentence that states it), ``"prefix"``
    (partial-solution prefixing: the first ``level`` reference steps start the assistant turn, the whole
    solution once ``level`` reaches its length) or ``"auto"`` (earlier versions' hints: ``"prefix"`` on
    the tiny arithmetic task, unguarded user-turn self-hints elsewhere). The default stays ``"auto"``
    so the committed reference runs stay valid."""


@register("sage")
@dataclass
class SageConfig(_HintOptions):
    """SAGE (Liao et al., 2026; chapter 7): roll out at level 0; prompts with no positive reward are
    re-rolled with hints of level 1, 2, 3 until one level gives a positive; train on-policy in (x, h).
    ``regenerate="all"`` re-runs the whole batch at each level, as the released code (its cost)."""

    regenerate: str = "collapsed"
    """``"collapsed"`` (each level rolls out the prompts still collapsed, the paper's Algorithm 1) or
    ``"all"`` (each level re-runs every prompt of the step and keeps the hinted groups, the released
    code)."""

    def build(self) -> Curator:
        return Curator(Selector(), SageSampler(self.max_level, self.positive_threshold, self.hint_source,
                                               self.max_retries, self.hint_max_new_tokens, self.regenerate,
                                               self.hint_mode),
                       name="sage")


@register("sage_light")
@dataclass
class SageLightConfig(_HintOptions):
    """SAGE-LIGHT (Liao et al., 2026; chapter 7): one rollout group per prompt at a hint level set by
    the prompt's previous accuracy (code: +1 if <= 0.1, -1 if > 0.35; paper: +1 if < 0.35)."""

    rule: str = "code"
    """The level schedule: ``"code"`` (the released code: up, down or unchanged by two thresholds) or
    ``"paper"`` (up when the previous accuracy < ``alpha``, never down)."""
    min_threshold: float = 0.1
    """The code's rule: one level up when the previous accuracy is <= this (0.1 in the released run
    script, 0.0 in its yaml)."""
    max_threshold: float = 0.35
    """The code's rule: one level down when the previous accuracy is > this."""
    alpha: float = 0.35
    """The paper's rule: one level up when the previous accuracy is < this."""

    def build(self) -> Curator:
        return Curator(Selector(), SageLightSampler(self.rule, self.min_threshold, self.max_threshold, self.alpha,
                                                    self.max_level, self.positive_threshold, self.hint_source,
                                                    self.max_retries, self.hint_max_new_tokens, self.hint_mode),
                       name="sage_light")
