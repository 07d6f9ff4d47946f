"""Countdown: reach a target number from 3 or 4 given numbers with + - * / (chapter 4, *The variance
audit*).

Rows are ``{"target": int, "nums": [int, ...]}`` (TinyZero's split of ``Jiayi-Pan/Countdown-Tasks-3to4``:
train = rows 0-8000, test = rows 8001-10001). The model thinks inside ``<think>`` tags and writes
one equation inside ``<answer>`` tags; :func:`~rlcurate.tasks.verifiers.countdown_reward` checks
that it uses every number exactly once and hits the target. There is no reference solution.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from rlcurate.tasks.base import Problem, Reward
from rlcurate.tasks.datasets import DatasetFormatError, DatasetTask, HubSpec, Record, SplitSpec, row_field
from rlcurate.tasks.verifiers import countdown_reward

__all__ = ["Countdown", "COUNTDOWN_SYSTEM_PROMPT", "countdown_question", "solve_countdown"]

COUNTDOWN_SYSTEM_PROMPT = (
    "You solve number puzzles. First reason inside <think> </think> tags. Then write only the final "
    "equation inside <answer> </answer> tags, for example <answer> (7 + 5) * 2 </answer>."
)

_HUB_ID = "Jiayi-Pan/Countdown-Tasks-3to4"


def countdown_question(numbers, target: int) -> str:
    """The user turn that poses a Countdown puzzle (chapter 4)."""
    listed = ", ".join(str(n) for n in numbers)
    return (
        f"Using the numbers [{listed}], write an equation that equals {target}. You may use +, -, * "
        "and / and parentheses, and each number must be used exactly once."
    )


def solve_countdown(numbers: Sequence[int], target: int) -> str | None:
    """An expression that uses each of ``numbers`` once and equals ``target``, or ``None`` (chapter 4).

    Exhaustive search over pairs combined with + - * / in exact arithmetic (at most 6 numbers, which
    keeps it well under a second for the 3-4 numbers of the datasets). The result is fully
    parenthesised, e.g. ``((96 - 74) + 37) - 4``; it is a check of solvability, not a hint style.
    """
    if isinstance(numbers, (str, bytes)) or not all(type(n) is int for n in numbers) or not 1 <= len(numbers) <= 6:
        raise ValueError(f"numbers must be 1 to 6 integers, got {numbers!r}")
    if type(target) is not int:
        raise ValueError(f"target must be an integer, got {target!r}")
    seen: set[tuple] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return None
        seen.add(key)
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                options = [(a - b, f"({ea} - {eb})"), (a * b, f"({ea} * {eb})"), (a + b, f"({ea} + {eb})")]
                if b != 0:
                    options.append((a / b, f"({ea} / {eb})"))
                for value, text in options:
                    if (text.startswith(f"({ea} +") or text.startswith(f"({ea} *")) and i > j:
                        continue  # + and * commute: try each pair once
                    found = search(rest + [(value, text)])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is not None and found.startswith("(") and found.endswith(")"):
        found = found[1:-1]
    return found


class Countdown(DatasetTask):
    """Countdown puzzles (TinyZero; used by INSIGHT): 8,001 train and 2,001 test (chapter 4).

    Args:
        format_score: reward of a completion whose ``<answer>`` is present but wrong; 0 (default)
            gives a binary reward, 0.1 the graded reward of TinyZero and INSIGHT.
        data_dir, source, system_prompt, prefill: see :class:`~rlcurate.tasks.datasets.DatasetTask`.

    ``Problem.answer`` is the target as a string; ``meta`` holds ``numbers`` and ``target``.
    Uids are ``countdown/<split>/<row>``.
    """

    name = "countdown"
    default_system_prompt = COUNTDOWN_SYSTEM_PROMPT
    splits = {
        "train": SplitSpec("countdown", "train", HubSpec(_HUB_ID, "train[:8001]")),
        "test": SplitSpec("countdown", "test", HubSpec(_HUB_ID, "train[8001:10002]")),
    }

    def __init__(self, data_dir=None, *, format_score: float = 0.0, **kwargs):
        super().__init__(data_dir, **kwargs)
        if isinstance(format_score, bool) or not isinstance(format_score, (int, float)) or not 0 <= format_score < 1:
            raise ValueError(f"format_score must be a number in [0, 1), got {format_score!r}")
        self.format_score = float(format_score)

    def _parse(self, record: Record, split: str, source: str) -> Problem:
        target = row_field(record, "target", int)
        nums = row_field(record, "nums", list)
        if len(nums) < 2:
            raise DatasetFormatError(record.source, record.line, "nums", f"needs at least 2 numbers, got {nums!r}")
        numbers = []
        for n in nums:
            if isinstance(n, float) and n.is_integer():
                n = int(n)
            if type(n) is not int or n < 0:
                raise DatasetFormatError(
                    record.source, record.line, "nums", f"must hold non-negative integers, got {nums!r}"
                )
            numbers.append(n)
        return Problem(
            uid=f"countdown/{split}/{record.index}",
            question=countdown_question(numbers, target),
            answer=str(target),
            solution=(),
            meta={
                "source": source, "line": record.line, "split": split,
                "numbers": tuple(numbers), "target": target, "n_numbers": len(numbers),
            },
        )

    def _score(self, problem: Problem, completion: str) -> Reward:
        return countdown_reward(
            completion, list(problem.meta["numbers"]), int(problem.meta["target"]), format_score=self.format_score
        )
