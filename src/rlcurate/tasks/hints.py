"""Hints that never state the final answer (chapter 7, *Hinting*): SAGE's rule, made checkable.

SAGE (Liao et al., 2026) conditions a hint on the reference solution, places it in the *user* turn
("Here is a hint to help you: ...") and forbids it to reveal the final answer; even its strongest
level "still requires the student to complete the solution". A training-time hint in this package
comes in one of two modes (``hint_mode`` of the SAGE strategies):

``"prefix"``
    partial-solution prefixing: the hint of level l is the first l reference steps, written at the
    start of the *assistant* turn, so that the model continues a solution that is already partly
    written and only the continuation is trained. Where a problem has l or fewer steps this is the
    whole solution, answer included. Only the arithmetic task in the tiny style with a scratchpad
    supports it (its ``hint_placement="assistant"``).
``"user"``
    SAGE's placement and rule: the hint goes into the user turn and never contains the final answer.
    From reference steps (:func:`user_hint`), the hint of level l is the first ``min(l, k)`` steps,
    where k (:func:`answer_free_steps`) is the number of leading steps that are safe to show:

    1. the last step is never shown (it completes the solution: for the arithmetic scratchpad the
       last column or the last running sum gives the leading digits or the answer itself);
    2. a step that states the answer is cut, and every step after it: the hint stops just before the
       first step in which the answer occurs (:func:`states_answer`).

    So a higher level shows at least what a lower one shows (each hint is a prefix of the next), and
    a problem with k = 0 (one step, or an answer already in its first step) has no hint at any level.

What "states the answer" means (:func:`states_answer`): the answer string, stripped, occurs in the
text as a plain substring, where a thousands separator may stand between two of its digits ("1,800"
states "1800"). It is deliberately strict: "5" is found in "15", so a one-digit answer cuts every step
that contains that digit. It checks the literal string, not its meaning ("1/2" does not state
"\\frac{1}{2}").

For free text (hints a policy writes itself) :func:`cut_at_answer` applies the same rule by
sentences: the text is cut just before the sentence (or line) in which the answer first occurs.
"""

from __future__ import annotations

import numbers
import re

__all__ = ["HINT_MODES", "states_answer", "answer_free_steps", "user_hint", "cut_at_answer"]

HINT_MODES = ("prefix", "user")


def _answer_pattern(answer: str) -> re.Pattern | None:
    """A regex for ``answer`` (stripped) that also accepts a comma between two of its digits."""
    a = answer.strip() if isinstance(answer, str) else ""
    if not a:
        return None
    parts = []
    for j, ch in enumerate(a):
        parts.append(re.escape(ch))
        if ch.isdigit() and j + 1 < len(a) and a[j + 1].isdigit():
            parts.append(",?")
    return re.compile("".join(parts))


def states_answer(text: str, answer: str) -> bool:
    """Whether ``text`` contains the final ``answer`` (see the module docstring: a plain substring,
    thousands separators between its digits allowed; an empty answer is never stated)."""
    pattern = _answer_pattern(answer)
    return pattern is not None and pattern.search(text) is not None


def answer_free_steps(problem) -> int:
    """k: how many leading reference steps of ``problem`` a user-turn hint may show: never the last
    step, and none from the first step that states the answer on (module docstring)."""
    steps = tuple(problem.solution)
    k = max(len(steps) - 1, 0)
    for j, step in enumerate(steps[:k]):
        if states_answer(step, problem.answer):
            return j
    return k


def user_hint(problem, level: int) -> str:
    """The user-turn hint of ``level`` (chapter 7): the first ``min(level, k)`` reference steps of
    ``problem`` joined by newlines, k = :func:`answer_free_steps`; ``""`` at level 0 or when k = 0.
    Never contains the answer; each level's hint is a prefix of the next one's."""
    if isinstance(level, bool) or not isinstance(level, numbers.Integral) or level < 0:
        raise ValueError(f"level must be a non-negative integer, got {level!r}")
    return problem.reveal(min(int(level), answer_free_steps(problem)))


_SENTENCE_END = re.compile(r"(?:[.!?](?=\s)|\n)")


def cut_at_answer(text: str, answer: str) -> str:
    """``text`` (stripped) cut just before the sentence or line in which ``answer`` first occurs
    (:func:`states_answer`); unchanged when it does not occur. The result never states the answer
    (it may be empty)."""
    text = text.strip()
    pattern = _answer_pattern(answer)
    m = pattern.search(text) if pattern is not None else None
    if m is None:
        return text
    start = 0
    for end in _SENTENCE_END.finditer(text, 0, m.start()):
        start = end.end()
    return text[:start].rstrip()
