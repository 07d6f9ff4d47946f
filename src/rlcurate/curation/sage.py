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

Where hints come from (``hint_source``):

* ``"task"``: the task's own ``hint(problem, level)`` (arithmetic: the first ``level`` scratchpad
  steps; the simulated world: a logit bonus per level). No generation, no compute.
* ``"self"``: the policy writes the hints (online self-hinting): one generation per prompt with the
  paper's hint prompt (:data:`HINT_SYSTEM_PROMPT`, :data:`HINT_USER_TEMPLATE`) given the question and the
  reference solution, answering with JSON ``{"level_1": ..., "level_2": ..., "level_3": ...}``;
  parsed leniently (:func:`parse_hint_payload`), up to ``max_retries`` generations for prompts whose
  answer does not parse; if none parses, the fallback reveals the first ceil(level / 4 * steps)
  reference steps (:func:`fallback_hints`). The hint generations are counted in the step's generated
  tokens, calls and generation time (not in ``rollouts``, which counts graded completions) and in the
  prompt's ``Group.generated_tokens``. Hints are cached per prompt for the step.
* ``"auto"`` (default): ``"task"`` when the task has a ``hint`` method, otherwise ``"self"``.

For belief-based selectors (chapter 9) a rescued SAGE group carries its unhinted evidence in
``pool_successes`` / ``pool_size`` (the level-0 group: 0 of G); SAGE-LIGHT's hinted groups carry none.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.base import Curator, Group, Sampler, Selector, StepContext
from rlcurate.curation.registry import register

__all__ = ["HINT_SYSTEM_PROMPT", "HINT_USER_TEMPLATE", "MAX_LEVEL", "HintSource", "SageSampler",
           "SageLightSampler", "parse_hint_payload", "fallback_hints", "next_level_code", "next_level_paper"]

MAX_LEVEL = 3

# The hint-writing prompt of SAGE (paper appendix B; BaohaoLiao/SAGE recipe/hint/prompt.py), kept
# verbatim because it is the experimental protocol: the system turn and the user-turn template.
HINT_SYSTEM_PROMPT = """You are a tutoring assistant that generates progressive hints to help students solve difficult problems without revealing the solution directly.

TASK:
Given a question and its solution, generate 3 levels of hints that progressively guide the student toward solving the problem independently.

HINT LEVELS:
- Level 1: Minimal hint - Points to the key concept or approach without specifics
- Level 2: Medium hint - Provides more direction on the method or intermediate steps
- Level 3: Detailed hint - Gives substantial guidance while still requiring the student to complete the solution

GUIDELINES:
- Never reveal the final answer
- Hints should inspire problem-solving, not just provide steps to copy
- Tailor hint difficulty to bridge the gap between the student's level and the solution

OUTPUT FORMAT:
```json
{
    "level_1": "minimal hint text",
    "level_2": "medium hint text",
    "level_3": "detailed hint text"
}
```"""

# (the released code has a space after "Question:"; the paper's appendix does not)
HINT_USER_TEMPLATE = "Question: \n{problem}\n\nSolution:\n{solution}\n"

_LEVEL_STRING = re.compile(r'["\']level_([1-9])["\']\s*:\s*"((?:[^"\\]|\\.)*)"', re.S)


# ----------------------------------------------------------------------------------------------
# Hints
# ----------------------------------------------------------------------------------------------


def parse_hint_payload(text: str, levels: int = MAX_LEVEL) -> dict[int, str] | None:
    """The hints ``{1: ..., 2: ..., 3: ...}`` in a model's answer to the hint prompt, or ``None``
    (chapter 7). Accepts a fenced ````json`` block, a bare object after some prose, or, when the
    object is not valid JSON (a trailing comma, a cut-off tail), every ``"level_k": "..."`` string
    pair found. Every level 1..``levels`` must be present as a non-empty string."""
    if not isinstance(text, str) or not text.strip():
        return None
    body = text
    fence = body.lower().find("```json")
    if fence >= 0:
        end = body.find("```", fence + 7)
        body = body[fence + 7:] if end < 0 else body[fence + 7:end]
    elif body.strip().startswith("```"):
        start = body.find("```")
        end = body.find("```", start + 3)
        body = body[start + 3:] if end < 0 else body[start + 3:end]
    found: dict[int, str] = {}
    start, stop = body.find("{"), body.rfind("}")
    if 0 <= start < stop:
        try:
            obj = json.loads(body[start:stop + 1])
        except (json.JSONDecodeError, ValueError):
            obj = None
        if isinstance(obj, dict):
            for key, value in obj.items():
                m = re.fullmatch(r"level_([1-9])", str(key).strip())
                if m and isinstance(value, str) and value.strip():
                    found[int(m.group(1))] = value.strip()
    if not all(k in found for k in range(1, levels + 1)):
        for m in _LEVEL_STRING.finditer(body):
            k = int(m.group(1))
            if k in found:
                continue
            try:
                value = json.loads(f'"{m.group(2)}"')
            except (json.JSONDecodeError, ValueError):
                value = m.group(2)
            if value.strip():
                found[k] = value.strip()
    if not all(k in found for k in range(1, levels + 1)):
        return None
    return {k: found[k] for k in range(1, levels + 1)}


def fallback_hints(problem, levels: int = MAX_LEVEL) -> dict[int, str]:
    """Hints revealing reference steps when the policy's hint never parses (chapter 7): level l shows
    the first max(1, ceil(l / (levels + 1) * n)) of the n steps (at most n), so level 3 of 3 shows
    three quarters of the solution. Empty strings when the problem has no reference steps."""
    steps = tuple(problem.solution)
    n = len(steps)
    out = {}
    for lv in range(1, levels + 1):
        k = min(n, max(1, math.ceil(lv / (levels + 1) * n))) if n else 0
        out[lv] = problem.reveal(k)
    return out


def _solution_text(problem) -> str:
    """The reference solution given to the hint writer: the steps, else the gold answer."""
    if problem.solution:
        return "\n".join(problem.solution)
    return problem.answer or ""


def render_hint_request(tokenizer, problem) -> str:
    """The hint prompt of ``problem`` rendered with ``tokenizer``'s chat template (system turn plus
    user turn; a template without a system role gets the system text at the top of the user turn)."""
    from rlcurate.tasks.base import render_chat

    user = HINT_USER_TEMPLATE.format(problem=problem.question, solution=_solution_text(problem))
    try:
        return render_chat(tokenizer, [{"role": "system", "content": HINT_SYSTEM_PROMPT},
                                       {"role": "user", "content": user}])
    except Exception:  # templates without a system role (the tiny model's) raise
        return render_chat(tokenizer, [{"role": "user", "content": HINT_SYSTEM_PROMPT + "\n\n" + user}])


class HintSource:
    """The hints of a step's prompts at levels 1..``max_level``, from the task or written by the
    policy (see the module docstring), cached per prompt for the step.

    Counters over the run (self-hinting only): ``requests`` (prompts the policy was asked to hint),
    ``attempts`` (batched hint generations made), ``failed`` (prompts that fell back to revealed
    steps); ``tokens`` holds the hint tokens generated per prompt in the current step.
    """

    def __init__(self, source: str = "auto", max_level: int = MAX_LEVEL, max_retries: int = 3,
                 max_new_tokens: int = 512):
        if source not in ("auto", "task", "self"):
            raise ValueError(f"hint_source must be 'auto', 'task' or 'self', got {source!r}")
        if not 1 <= int(max_level) <= 9:
            raise ValueError(f"max_level must lie in 1..9, got {max_level!r}")
        if int(max_retries) < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries!r}")
        self.source = source
        self.max_level = int(max_level)
        self.max_retries = int(max_retries)
        self.max_new_tokens = int(max_new_tokens)
        self._cache_step: int | None = None
        self._cache: dict[int, dict[int, str]] = {}
        self.tokens: dict[int, int] = {}  # hint tokens generated per prompt this step
        self.requests = self.attempts = self.failed = 0

    def kind(self, task) -> str:
        if self.source != "auto":
            return self.source
        return "task" if callable(getattr(task, "hint", None)) else "self"

    def hints(self, ctx: StepContext, indices: Sequence[int]) -> dict[int, dict[int, str]]:
        """``{index: {level: hint text}}`` for the pool indices ``indices``."""
        if self._cache_step != ctx.step:
            self._cache_step, self._cache, self.tokens = ctx.step, {}, {}
        need = [int(i) for i in dict.fromkeys(indices) if int(i) not in self._cache]
        if need:
            if self.kind(ctx.task) == "task":
                for i in need:
                    p = ctx.problems[i]
                    self._cache[i] = {lv: ctx.task.hint(p, lv) for lv in range(1, self.max_level + 1)}
            else:
                self._cache.update(self._self_hints(ctx, need))
        return {int(i): self._cache[int(i)] for i in indices}

    def _self_hints(self, ctx: StepContext, indices: list[int]) -> dict[int, dict[int, str]]:
        if ctx.tokenizer is None:
            raise ValueError("self-hinting needs a tokenizer; this task has no hint() method")
        out: dict[int, dict[int, str]] = {}
        with_solution = [i for i in indices if _solution_text(ctx.problems[i]).strip()]
        for i in indices:
            if i not in with_solution:
                out[i] = {lv: "" for lv in range(1, self.max_level + 1)}
        prompts = {i: render_hint_request(ctx.tokenizer, ctx.problems[i]) for i in with_solution}
        remaining = list(with_solution)
        self.requests += len(remaining)
        for _ in range(self.max_retries):
            if not remaining:
                break
            written = ctx.generate_text([prompts[i] for i in remaining], self.max_new_tokens)
            self.attempts += 1
            still = []
            for i, comp in zip(remaining, written):
                self.tokens[i] = self.tokens.get(i, 0) + (len(comp.token_ids) if comp is not None else 0)
                parsed = parse_hint_payload(comp.text if comp is not None else "", self.max_level)
                if parsed is None:
                    still.append(i)
                else:
                    out[i] = parsed
            remaining = still
        for i in remaining:
            self.failed += 1
            out[i] = fallback_hints(ctx.problems[i], self.max_level)
        return out


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

    ``last_stats`` after each step: prompts collapsed at level 0, prompts rolled out at each level,
    prompts rescued (a positive at some level).
    """

    name = "sage"

    def __init__(self, max_level: int = MAX_LEVEL, positive_threshold: float = 0.0, hint_source: str = "auto",
                 max_retries: int = 3, hint_max_new_tokens: int = 512, regenerate: str = "collapsed"):
        if regenerate not in ("collapsed", "all"):
            raise ValueError(f"regenerate must be 'collapsed' or 'all', got {regenerate!r}")
        self.regenerate = regenerate
        self.max_level = int(max_level)
        self.positive_threshold = float(positive_threshold)
        self.hints = HintSource(hint_source, self.max_level, max_retries, hint_max_new_tokens)
        self.last_stats: dict[str, Any] = {}

    def metrics(self) -> dict[str, float]:
        st = self.last_stats or {}
        levels = st.get("rolled_at_level", [])
        out = {"sage_collapsed": st.get("collapsed", 0), "sage_rescued": st.get("rescued", 0)}
        out.update({f"sage_rolled_level{lv}": n for lv, n in enumerate(levels)})
        return out

    def rollout(self, ctx: StepContext, indices: list[int]) -> list[Group]:
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
                                     hint_levels=[level if k in want else 0 for k in range(len(indices))])
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
                                   hint_levels=[level] * len(todo))
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
        max_level, positive_threshold, hint_source, max_retries, hint_max_new_tokens: as for
            :class:`SageSampler`; the accuracy of a visit is the share of rewards > ``positive_threshold``.

    State (kept across steps, saved in checkpoints): per pool index, the level used and the accuracy
    reached at its last visit.
    """

    name = "sage_light"

    def __init__(self, rule: str = "code", min_threshold: float = 0.1, max_threshold: float = 0.35,
                 alpha: float = 0.35, max_level: int = MAX_LEVEL, positive_threshold: float = 0.0,
                 hint_source: str = "auto", max_retries: int = 3, hint_max_new_tokens: int = 512):
        if rule not in ("code", "paper"):
            raise ValueError(f"rule must be 'code' or 'paper', got {rule!r}")
        self.rule = rule
        self.min_threshold, self.max_threshold, self.alpha = float(min_threshold), float(max_threshold), float(alpha)
        self.max_level = int(max_level)
        self.positive_threshold = float(positive_threshold)
        self.hints = HintSource(hint_source, self.max_level, max_retries, hint_max_new_tokens)
        self.last_level: dict[int, int] = {}
        self.last_acc: dict[int, float] = {}

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
        levels = [self.scheduled_level(i) for i in indices]
        hinted = [i for i, lv in zip(indices, levels) if lv > 0]
        hints = self.hints.hints(ctx, hinted) if hinted else {}
        texts, used = [], []
        for i, lv in zip(indices, levels):
            text = hints[int(i)].get(lv, "") if lv > 0 else ""
            texts.append(text or None)
            used.append(lv if text else 0)  # no hint text (no reference solution): unhinted
        groups = ctx.generate(indices, ctx.group_size, hints=texts, hint_levels=used)
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


@register("sage")
def sage(max_level: int = MAX_LEVEL, positive_threshold: float = 0.0, hint_source: str = "auto",
         max_retries: int = 3, hint_max_new_tokens: int = 512, regenerate: str = "collapsed") -> Curator:
    """SAGE (Liao et al., 2026; chapter 7): roll out at level 0; prompts with no positive reward are
    re-rolled with hints of level 1, 2, 3 until one level gives a positive; train on-policy in (x, h).
    ``regenerate="all"`` re-runs the whole batch at each level, as the released code (its cost)."""
    return Curator(Selector(), SageSampler(max_level, positive_threshold, hint_source, max_retries,
                                           hint_max_new_tokens, regenerate), name="sage")


@register("sage_light")
def sage_light(rule: str = "code", min_threshold: float = 0.1, max_threshold: float = 0.35, alpha: float = 0.35,
               max_level: int = MAX_LEVEL, positive_threshold: float = 0.0, hint_source: str = "auto",
               max_retries: int = 3, hint_max_new_tokens: int = 512) -> Curator:
    """SAGE-LIGHT (Liao et al., 2026; chapter 7): one rollout group per prompt at a hint level set by
    the prompt's previous accuracy (code: +1 if <= 0.1, -1 if > 0.35; paper: +1 if < 0.35)."""
    return Curator(Selector(), SageLightSampler(rule, min_threshold, max_threshold, alpha, max_level,
                                                positive_threshold, hint_source, max_retries,
                                                hint_max_new_tokens), name="sage_light")
