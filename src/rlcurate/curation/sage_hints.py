"""Hints for SAGE and SAGE-LIGHT (Liao et al., 2026; chapter 7, *Hinting*): the hints of a collapsed
prompt at levels 1..3, and the paper's prompt for the policy to write them. The samplers that use
them: :mod:`rlcurate.curation.sage`.

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

What a hint may say and where it goes (``hint_mode``; the rule itself: :mod:`rlcurate.tasks.hints`):

* ``"user"``: SAGE's rule. The hint is written into the user turn and never states the final answer.
  Task hints are the reference steps under that rule (:func:`rlcurate.tasks.hints.user_hint`: the
  first ``min(level, k)`` steps, never the last step, none from the first step that states the answer
  on). Self-written hints are conditioned on the reference solution (its steps; a problem without
  steps gives the hint writer its final answer instead, as SAGE's released code does) and each level
  is cut just before the sentence that first states the answer
  (:func:`rlcurate.tasks.hints.cut_at_answer`; counted in ``HintSource.cut``); the fallback shows
  only steps the rule allows. A level left empty is not rolled out.
* ``"prefix"``: partial-solution prefixing, the contrast: the task's ``hint(problem, level)`` (the
  first ``level`` reference steps) written at the start of the assistant turn. Needs task hints and a
  task that can place them there (the tiny arithmetic task with a scratchpad); with the tiny
  arithmetic task's defaults it is exactly ``"auto"``.
* ``"auto"`` (the default): what earlier versions did, kept so that the committed reference runs
  (chapters 7 and 10, tiny arithmetic task) stay valid: the task's own hints where the task puts them
  (the tiny arithmetic task: an assistant prefix, i.e. ``"prefix"``), and self-written hints in the
  user turn without the answer guard.
"""

from __future__ import annotations

import json
import math
import re
from typing import Sequence

from rlcurate._validate import as_int
from rlcurate.curation.base import StepContext
from rlcurate.tasks.hints import answer_free_steps, cut_at_answer, user_hint

__all__ = ["HINT_SYSTEM_PROMPT", "HINT_USER_TEMPLATE", "MAX_LEVEL", "HINT_MODES", "HintSource", "parse_hint_payload",
           "fallback_hints", "render_hint_request", "check_hint_mode"]

MAX_LEVEL = 3
HINT_MODES = ("auto", "prefix", "user")

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


def fallback_hints(problem, levels: int = MAX_LEVEL, never_reveal: bool = False) -> dict[int, str]:
    """Hints revealing reference steps when the policy's hint never parses (chapter 7): level l shows
    the first max(1, ceil(l / (levels + 1) * n)) of the n steps (at most n), so level 3 of 3 shows
    three quarters of the solution. Empty strings when the problem has no reference steps.
    ``never_reveal`` (``hint_mode="user"``): at most the k steps that SAGE's rule allows
    (:func:`rlcurate.tasks.hints.answer_free_steps`), so no level states the answer."""
    steps = tuple(problem.solution)
    n = len(steps)
    cap = answer_free_steps(problem) if never_reveal else n
    out = {}
    for lv in range(1, levels + 1):
        k = min(n, max(1, math.ceil(lv / (levels + 1) * n))) if n else 0
        out[lv] = problem.reveal(min(k, cap))
    return out


def check_hint_mode(mode, source: str = "auto") -> None:
    """Refuse a ``hint_mode`` that is not one of :data:`HINT_MODES`, or ``"prefix"`` with self-written
    hints (chapter 7): one ``ValueError`` that names the value and the choices."""
    if not isinstance(mode, str) or mode not in HINT_MODES:
        raise ValueError(f"hint_mode must be 'auto', 'prefix' (the first reference steps at the start of the "
                         f"assistant turn) or 'user' (SAGE: a hint in the user turn that never states the answer), "
                         f"got {mode!r}")
    if mode == "prefix" and source == "self":
        raise ValueError("hint_mode='prefix' needs the task's hints (hint_source 'task' or 'auto'): a hint the "
                         "policy writes is advice for the user turn, not the start of a solution")


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
    steps), ``cut`` (with ``mode="user"``: written hint levels that stated the answer and were cut);
    ``tokens`` holds the hint tokens generated per prompt in the current step.

    ``mode`` is the strategy's ``hint_mode`` (see the module docstring): ``"user"`` makes every hint
    obey SAGE's never-reveal rule; ``"auto"`` and ``"prefix"`` give the hints of earlier versions.
    """

    def __init__(self, source: str = "auto", max_level: int = MAX_LEVEL, max_retries: int = 3,
                 max_new_tokens: int = 512, mode: str = "auto"):
        if source not in ("auto", "task", "self"):
            raise ValueError(f"hint_source must be 'auto', 'task' or 'self', got {source!r}")
        check_hint_mode(mode, source)
        if not 1 <= int(max_level) <= 9:
            raise ValueError(f"max_level must lie in 1..9, got {max_level!r}")
        if int(max_retries) < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries!r}")
        self.source = source
        self.mode = mode
        self.max_level = int(max_level)
        self.max_retries = int(max_retries)
        self.max_new_tokens = as_int(max_new_tokens, "hint_max_new_tokens", minimum=1)
        self._cache_step: int | None = None
        self._cache: dict[int, dict[int, str]] = {}
        self.tokens: dict[int, int] = {}  # hint tokens generated per prompt this step
        self.requests = self.attempts = self.failed = self.cut = 0

    def kind(self, task) -> str:
        if self.source != "auto":
            return self.source
        return "task" if callable(getattr(task, "hint", None)) else "self"

    @property
    def render_mode(self) -> str | None:
        """The ``hint_mode`` handed to ``ctx.generate`` (``None`` for ``"auto"``: the task's placement)."""
        return None if self.mode == "auto" else self.mode

    def check_task(self, task) -> None:
        """Refuse (``ValueError``) a ``mode`` that ``task`` cannot place: ``"prefix"`` with self-written
        hints, a mode outside the task's ``hint_modes``, or ``"auto"`` with task hints from a task without a
        ``hint`` method (chapter 7)."""
        if task is None:
            return
        name = getattr(task, "name", type(task).__name__)
        if self.mode == "auto":
            if self.kind(task) == "task" and not callable(getattr(task, "hint", None)):
                raise ValueError(f"hint_source='task' with hint_mode='auto' asks task {name!r} for its hint(), which it "
                                 "does not have; use hint_mode='user' (the reference solution's steps, never the answer)")
            return
        if self.mode == "prefix" and self.kind(task) == "self":
            raise ValueError(f"hint_mode='prefix' needs the task's hints, and task {name!r} has no hint() method "
                             "(its hints are written by the policy); use hint_mode='user'")
        modes = tuple(getattr(task, "hint_modes", ("user",)))
        if self.mode not in modes:
            raise ValueError(f"hint_mode={self.mode!r}: task {name!r} takes hint_mode 'auto'"
                             f"{''.join(f' or {m!r}' for m in modes)}; 'prefix' (the first reference steps at the "
                             "start of the assistant turn) needs the arithmetic task in the tiny style with "
                             "scratchpad=True")

    def hints(self, ctx: StepContext, indices: Sequence[int]) -> dict[int, dict[int, str]]:
        """``{index: {level: hint text}}`` for the pool indices ``indices``."""
        if self._cache_step != ctx.step:
            self._cache_step, self._cache, self.tokens = ctx.step, {}, {}
        need = [int(i) for i in dict.fromkeys(indices) if int(i) not in self._cache]
        if need:
            if self.kind(ctx.task) == "task":
                for i in need:
                    p = ctx.problems[i]
                    if self.mode == "user":  # the reference steps under the never-reveal rule
                        self._cache[i] = {lv: user_hint(p, lv) for lv in range(1, self.max_level + 1)}
                    else:
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
                elif self.mode == "user":  # never the answer: cut each level before it is stated
                    answer = ctx.problems[i].answer
                    out[i] = {lv: cut_at_answer(text, answer) for lv, text in parsed.items()}
                    self.cut += sum(out[i][lv] != text.strip() for lv, text in parsed.items())
                else:
                    out[i] = parsed
            remaining = still
        for i in remaining:
            self.failed += 1
            out[i] = fallback_hints(ctx.problems[i], self.max_level, never_reveal=self.mode == "user")
        return out
