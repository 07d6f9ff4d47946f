"""The task interface shared by every prompt source (chapter 4).

A task does three things: it lists problems, it turns a problem (and an optional training-time hint,
chapter 7) into the exact text a model is conditioned on, and it scores a completion. Scoring is the
verifier of RL with verifiable rewards, r(x, a) in [0, 1]; it must never raise on model text, because
one malformed completion must not kill a training run or an audit. Garbage scores 0 and the reason is
kept in :attr:`Reward.reason` (and logged at debug level).
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    """One prompt of a task.

    Attributes:
        uid: stable identifier, unique within its task and split (used as the key of audit files,
            beliefs and checkpoints, so it must not depend on list order).
        question: the problem statement, without any chat template.
        answer: the gold final answer as a canonical string.
        solution: a reference solution split into steps; :meth:`reveal` gives the first ``k`` of them
            (hints in chapter 7, reference answers for DRO in chapter 8).
        meta: free-form facts about the problem (difficulty level, operator, source file and line).
    """

    uid: str
    question: str
    answer: str
    solution: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def reveal(self, k: int) -> str:
        """The first ``k`` steps of the reference solution joined by newlines (``k`` is clipped)."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        return "\n".join(self.solution[:k])


@dataclass(frozen=True)
class Reward:
    """A verifier's verdict: ``value`` in [0, 1] and a short human-readable ``reason``."""

    value: float
    reason: str = ""


def render_chat(tokenizer, messages: Sequence[Mapping[str, str]], prefill: str = "") -> str:
    """Apply ``tokenizer``'s chat template with a generation prompt, then append ``prefill``.

    ``prefill`` is text the assistant turn starts with (for example ``"12 + 34 ="``), which steers a
    small instruct model to answer in a fixed format.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat template; set tokenizer.chat_template "
            "or use a task format that does not need one"
        )
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return text + prefill


def check_hint_mode(task, hint_mode) -> None:
    """Refuse a ``hint_mode`` that ``task.render`` cannot honour (chapter 7): one clear ``ValueError``."""
    if hint_mode is None:
        return
    modes = tuple(getattr(task, "hint_modes", ("user",)))
    if hint_mode not in ("prefix", "user"):
        raise ValueError(f"hint_mode must be 'prefix' or 'user' (or None: the task's own placement), got {hint_mode!r}")
    if hint_mode not in modes:
        raise ValueError(f"hint_mode={hint_mode!r}: task {getattr(task, 'name', type(task).__name__)!r} takes "
                         f"hint_mode {' or '.join(repr(m) for m in modes) or 'None only'}; 'prefix' (the first "
                         "reference steps at the start of the assistant turn) needs the arithmetic task in the "
                         "tiny style with scratchpad=True")


def prompt_tokens(text: str, tokenizer, limit: int) -> int:
    """Tokens of ``text`` (no special tokens added, as the rollout engine encodes it), or, for a text
    far longer than ``limit`` tokens, the count on its first ``8 * limit + 256`` characters when that
    alone exceeds ``limit`` by a margin (a lower bound that already decides; a 5 MB prompt is not
    tokenized whole, which takes seconds and gigabytes)."""
    head = 8 * limit + 256
    if limit > 0 and len(text) > head:
        n = len(tokenizer.encode(text[:head], add_special_tokens=False))
        if n > limit + 64:  # the cut changes at most the last word's tokens
            return n
    return len(tokenizer.encode(text, add_special_tokens=False))


def split_long_prompts(problems: Sequence[Problem], render, tokenizer, max_tokens: int, keep: int | None = None):
    """``(kept, too_long)``: the problems whose rendered prompt ``render(problem)`` has at most
    ``max_tokens`` tokens (0: no limit), in order, and ``(problem, tokens)`` for the others (chapter 5,
    the trainer's prompt-length guard). With ``keep``, stop once that many are kept."""
    kept, too_long = [], []
    for problem in problems:
        if keep is not None and len(kept) >= keep:
            break
        n = prompt_tokens(render(problem), tokenizer, max_tokens) if max_tokens else 0
        if max_tokens and n > max_tokens:
            too_long.append((problem, n))
        else:
            kept.append(problem)
    return kept, too_long


class Task(abc.ABC):
    """A source of problems with a verifier. Subclasses implement :meth:`problems`,
    :meth:`messages` and :meth:`_score`; they may override :meth:`prefill` and :meth:`render`."""

    name: str = "task"
    hint_modes: tuple[str, ...] = ("user",)
    """The ``hint_mode`` values :meth:`render` takes besides ``None`` (chapter 7,
    :mod:`rlcurate.tasks.hints`): a task puts hints in the user turn unless it says otherwise."""

    @abc.abstractmethod
    def problems(self, split: str = "train") -> list[Problem]:
        """All problems of ``split`` (``"train"`` or ``"test"``), in a fixed order."""

    @abc.abstractmethod
    def messages(self, problem: Problem, hint: str | None = None) -> list[dict[str, str]]:
        """The chat turns that pose ``problem``; ``hint`` (chapter 7) is added to the user turn."""

    def prefill(self, problem: Problem) -> str:
        """Text the assistant turn starts with (empty by default)."""
        return ""

    def render(self, problem: Problem, tokenizer, hint: str | None = None, hint_mode: str | None = None) -> str:
        """The exact text a model is conditioned on: chat template, then the prefill. ``hint_mode``
        (chapter 7): ``None`` or ``"user"``, both the user turn; ``"prefix"`` is refused (this task
        has no assistant-side hints)."""
        check_hint_mode(self, hint_mode)
        return render_chat(tokenizer, self.messages(problem, hint), self.prefill(problem))

    @abc.abstractmethod
    def _score(self, problem: Problem, completion: str) -> Reward:
        """Score ``completion``; may raise on malformed text (:meth:`reward` catches it)."""

    def reward(self, problem: Problem, completion: str) -> Reward:
        """r(x, a) in [0, 1]. Never raises: any failure of the verifier scores 0 with its reason."""
        try:
            if not isinstance(completion, str):
                return Reward(0.0, f"completion is {type(completion).__name__}, not str")
            result = self._score(problem, completion)
            value = float(result.value)
            if not 0.0 <= value <= 1.0 or value != value:
                return Reward(0.0, f"verifier returned {value!r} outside [0, 1]")
            return result
        except Exception as exc:  # a verifier must not kill a run on model text
            log.debug("verifier %s failed on problem %s: %r", self.name, problem.uid, exc)
            return Reward(0.0, f"verifier error: {type(exc).__name__}: {exc}")
