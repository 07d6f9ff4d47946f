"""MATH competition problems: MATH-500 and the MATH training problems of levels 3-5 (chapter 4,
*The variance audit*).

Rows carry ``problem`` (or ``question``), ``answer`` (or ``gt_answer``; when both are missing the
last ``\\boxed{}`` of ``solution`` is used), and optionally ``solution``, ``subject`` (or ``type``),
``level`` (an integer or ``"Level 3"``) and ``unique_id``. The model is asked for a ``\\boxed{}``
answer, which :func:`~rlcurate.tasks.verifiers.math_reward` checks with ``math-verify``. A reference
solution is split into steps (paragraphs, then sentences outside formulas) for hints. A row with an
empty answer cannot be graded: it is skipped with a warning and listed in ``task.skipped`` (two rows
of the levels 3-5 file, lines 5055 and 5159, are such multiple-choice problems).

Tasks: ``math500`` (test split only; local ``math500/test.jsonl``, Hub ``HuggingFaceH4/MATH-500``),
``math_l3to5`` (train split only; local ``math_train_l3to5/train.jsonl`` or ``.parquet``, Hub
``hkust-nlp/SimpleRL-Zoo-Data``, folder ``simplelr_qwen_level3to5``; it has no reference solutions),
and ``math`` (train = ``math_l3to5``, test = ``math500``, the SimpleRL-Zoo set-up).
"""

from __future__ import annotations

import re
from typing import Iterable

from rlcurate.tasks.base import Problem, Reward
from rlcurate.tasks.datasets import (
    DatasetFormatError,
    DatasetTask,
    HubSpec,
    Record,
    SplitSpec,
    UnusableRow,
    row_field,
)
from rlcurate.tasks.verifiers import extract_boxed, math_reward

__all__ = [
    "MATH_SYSTEM_PROMPT",
    "MathTask",
    "MATH500",
    "MATHLevel3to5",
    "MATH",
    "split_solution",
]

MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

_MATH500 = SplitSpec("math500", "test", HubSpec("HuggingFaceH4/MATH-500", "test"))
_L3TO5 = SplitSpec(
    "math_train_l3to5", "train",
    HubSpec("hkust-nlp/SimpleRL-Zoo-Data", "train", data_dir="simplelr_qwen_level3to5"),
)


# ----------------------------------------------------------------------------------------------
# Splitting a worked solution into steps
# ----------------------------------------------------------------------------------------------
def _sentence_ends(par: str) -> list[int]:
    """Positions just after each sentence end of a paragraph, ignoring text inside formulas,
    braces and [asy] pictures. A sentence ends at ``.``, ``!`` or ``?`` (also ``.$`` or ``.\\]``)
    followed by white space and a capital letter."""
    ends: list[int] = []
    i, n = 0, len(par)
    inline = display = asy = False
    depth = 0

    def boundary(k: int) -> bool:  # a sentence may end just before position k
        j = k
        if j >= n or not par[j].isspace():
            return False
        while j < n and par[j].isspace():
            j += 1
        return j < n and par[j].isupper()

    while i < n:
        if par.startswith("[asy]", i):
            asy = True
        elif par.startswith("[/asy]", i):
            asy = False
            i += len("[/asy]")
            continue
        if asy:
            i += 1
            continue
        c = par[i]
        if c == "\\" and i + 1 < n:
            nxt = par[i + 1]
            if nxt in "[(":
                display = True
            elif nxt in "])":
                display = False
                if par[i - 1 : i] in (".", "!", "?") and boundary(i + 2):
                    ends.append(i + 2)
            i += 2
            continue
        if c == "$":
            if par.startswith("$$", i):
                display = not display
                i += 2
                if not display and par[i - 3 : i - 2] in (".", "!", "?") and boundary(i):
                    ends.append(i)
                continue
            inline = not inline
            if not inline and par[i - 1 : i] in (".", "!", "?") and boundary(i + 1):
                ends.append(i + 1)
            i += 1
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth = max(depth - 1, 0)
        elif c in ".!?" and not (inline or display) and depth == 0 and boundary(i + 1):
            ends.append(i + 1)
        i += 1
    return ends


def split_solution(text: str) -> tuple[str, ...]:
    """Split a worked MATH solution into steps: paragraphs (blank-line separated), each cut into
    sentences outside formulas and [asy] pictures (chapter 4; the steps are what hints reveal in
    chapter 7). Joining the steps loses only white space."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    paragraphs: list[str] = []
    for par in re.split(r"(\n\s*\n)", text):
        # keep an [asy] picture (which may contain blank lines) inside one paragraph
        if paragraphs and paragraphs[-1].count("[asy]") > paragraphs[-1].count("[/asy]"):
            paragraphs[-1] += par
        elif not re.fullmatch(r"\n\s*\n", par):
            paragraphs.append(par)
    steps: list[str] = []
    for par in paragraphs:
        start = 0
        for end in _sentence_ends(par) + [len(par)]:
            piece = par[start:end].strip()
            if piece:
                steps.append(piece)
            start = end
    return tuple(steps)


# ----------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------
def _level(record: Record) -> int | None:
    raw = record.data.get("level")
    if raw is None:
        return None
    if isinstance(raw, str):
        m = re.fullmatch(r"\s*(?:Level\s*)?(\d+)\s*", raw)
        if m:
            return int(m.group(1))
        if raw.strip() in ("?", "Level ?"):
            return None
        raise DatasetFormatError(record.source, record.line, "level", f"must be an integer or 'Level N', got {raw!r}")
    return row_field(record, "level", int)


class MathTask(DatasetTask):
    """A MATH-style task: boxed final answers verified with ``math-verify`` (chapter 4).

    Args:
        data_dir, source, system_prompt, prefill: see :class:`~rlcurate.tasks.datasets.DatasetTask`.
        levels: keep only problems of these difficulty levels (``None`` keeps all; problems without a
            level are kept only when ``levels`` is ``None``).
        max_chars: bound on the text handed to ``math-verify`` (see :func:`math_reward`).
    """

    default_system_prompt = MATH_SYSTEM_PROMPT

    def __init__(self, data_dir=None, *, levels: Iterable[int] | None = None, max_chars: int = 4000, **kwargs):
        super().__init__(data_dir, **kwargs)
        if levels is not None:
            levels = tuple(levels)
            if not levels or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 5 for v in levels):
                raise ValueError(f"levels must be integers in 1..5, got {levels!r}")
        if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 1:
            raise ValueError(f"max_chars must be a positive integer, got {max_chars!r}")
        self.levels = levels
        self.max_chars = max_chars

    def _parse(self, record: Record, split: str, source: str) -> Problem | None:
        question = row_field(record, ("problem", "question"), str)
        if not question.strip():
            raise DatasetFormatError(record.source, record.line, "problem", "is empty")
        solution = row_field(record, "solution", str, required=False)
        answer = row_field(record, ("answer", "gt_answer"), str, required=False)
        if answer is None:
            answer = extract_boxed(solution) if solution else None
            if answer is None:
                raise DatasetFormatError(
                    record.source, record.line, "answer", "missing (and no \\boxed{} answer in 'solution')"
                )
        if not answer.strip():
            raise UnusableRow(record.source, record.line, "answer", "is empty")
        level = _level(record)
        if not self._keep_level(level, split):
            return None
        subject = row_field(record, ("subject", "type"), str, required=False)
        unique_id = row_field(record, "unique_id", str, required=False)
        key = unique_id.removesuffix(".json") if unique_id else f"{split}/{record.index}"
        meta = {"source": source, "line": record.line, "split": split, "level": level, "subject": subject}
        if unique_id:
            meta["unique_id"] = unique_id
        return Problem(
            uid=f"{self._uid_prefix(split)}/{key}",
            question=question.strip(),
            answer=answer.strip(),
            solution=split_solution(solution) if solution else (),
            meta=meta,
        )

    def _uid_prefix(self, split: str) -> str:
        return self.name

    def _keep_level(self, level: int | None, split: str) -> bool:
        return self.levels is None or level in self.levels

    def _score(self, problem: Problem, completion: str) -> Reward:
        return math_reward(completion, problem.answer, max_chars=self.max_chars)


class MATH500(MathTask):
    """MATH-500 (Lightman et al., 2023): 500 test problems of MATH, levels 1-5, with solutions (chapter 4).

    Only a ``"test"`` split; uids are ``math500/test/<subject>/<n>`` from the dataset's ``unique_id``.
    """

    name = "math500"
    splits = {"test": _MATH500}


class MATHLevel3to5(MathTask):
    """MATH training problems of levels 3-5, the 8,523-problem SimpleRL-Zoo set (chapter 4).

    Only a ``"train"`` split, answers without reference solutions; uids are ``math_l3to5/train/<row>``.
    By default rows outside levels 3-5 are dropped, so a full MATH train file can be used as well.
    """

    name = "math_l3to5"
    splits = {"train": _L3TO5}

    def __init__(self, data_dir=None, *, levels: Iterable[int] | None = (3, 4, 5), **kwargs):
        super().__init__(data_dir, levels=levels, **kwargs)


class MATH(MathTask):
    """MATH for RL: train on levels 3-5 (:class:`MATHLevel3to5`), test on MATH-500 (chapter 4).

    Uids are those of the two underlying tasks (``math_l3to5/...`` and ``math500/...``).
    """

    name = "math"
    splits = {"train": _L3TO5, "test": _MATH500}

    def _uid_prefix(self, split: str) -> str:
        return "math_l3to5" if split == "train" else "math500"

    def _keep_level(self, level: int | None, split: str) -> bool:
        if self.levels is not None:
            return level in self.levels
        return split != "train" or level is None or level in (3, 4, 5)
