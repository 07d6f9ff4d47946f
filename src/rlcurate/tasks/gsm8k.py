"""GSM8K: grade-school math word problems with a numeric answer (chapter 4, *The variance audit*).

Rows are ``{"question": str, "answer": str}`` where ``answer`` is a worked solution, one step per
line with ``<<a*b=c>>`` calculator notes, ending in ``#### <number>``. The gold answer is that
number without thousands separators; the solution lines (calculator notes removed) are the steps
that hints reveal. Local files: ``<data_dir>/gsm8k/{train,test}.jsonl``; Hub: ``openai/gsm8k``
(config ``main``).
"""

from __future__ import annotations

import re

from rlcurate.tasks.base import Problem, Reward
from rlcurate.tasks.datasets import DatasetFormatError, DatasetTask, HubSpec, Record, SplitSpec, row_field
from rlcurate.tasks.verifiers import gsm8k_reward, parse_number

__all__ = ["GSM8K", "GSM8K_SYSTEM_PROMPT", "parse_gsm8k_solution"]

GSM8K_SYSTEM_PROMPT = (
    "Solve the math word problem. Think it through step by step, then give the final answer "
    "on its own last line in the form '#### <number>', with no units."
)

_CALC = re.compile(r"<<[^<>]*>>")


def parse_gsm8k_solution(answer: str) -> tuple[tuple[str, ...], str]:
    """Split a GSM8K ``answer`` field into solution steps and the gold number (chapter 4).

    Steps are the non-empty lines before ``####`` with calculator notes ``<<...>>`` removed; the gold
    answer is the number after ``####`` with commas and ``$`` removed. Raises ``ValueError`` naming
    the problem when there is no ``####`` or no number after it.
    """
    if "####" not in answer:
        raise ValueError("has no '#### <number>' final answer")
    body, final = answer.rsplit("####", 1)
    final = final.strip()
    value = parse_number(final)
    if value is None:
        raise ValueError(f"final answer after '####' is not a number: {final[:40]!r}")
    gold = final.replace(",", "").replace("$", "").strip().rstrip(".")
    steps = tuple(s for s in (_CALC.sub("", line).strip() for line in body.splitlines()) if s)
    return steps, gold


class GSM8K(DatasetTask):
    """GSM8K (Cobbe et al., 2021): 7,473 train and 1,319 test word problems (chapter 4).

    The verifier is :func:`~rlcurate.tasks.verifiers.gsm8k_reward`; ``require_marker=True`` makes it
    score only answers written after ``####``. Problem uids are ``gsm8k/<split>/<row>``.
    """

    name = "gsm8k"
    default_system_prompt = GSM8K_SYSTEM_PROMPT
    splits = {
        "train": SplitSpec("gsm8k", "train", HubSpec("openai/gsm8k", "train", config="main")),
        "test": SplitSpec("gsm8k", "test", HubSpec("openai/gsm8k", "test", config="main")),
    }

    def __init__(self, data_dir=None, *, require_marker: bool = False, **kwargs):
        super().__init__(data_dir, **kwargs)
        if not isinstance(require_marker, bool):
            raise ValueError(f"require_marker must be True or False, got {require_marker!r}")
        self.require_marker = require_marker

    def _parse(self, record: Record, split: str, source: str) -> Problem:
        question = row_field(record, "question", str)
        answer = row_field(record, "answer", str)
        if not question.strip():
            raise DatasetFormatError(record.source, record.line, "question", "is empty")
        try:
            steps, gold = parse_gsm8k_solution(answer)
        except ValueError as exc:
            raise DatasetFormatError(record.source, record.line, "answer", str(exc)) from None
        return Problem(
            uid=f"gsm8k/{split}/{record.index}",
            question=question.strip(),
            answer=gold,
            solution=steps,
            meta={"source": source, "line": record.line, "split": split, "n_steps": len(steps)},
        )

    def split(self, completion: str) -> tuple[str, str | None]:
        """``(reasoning, answer)`` of a completion, cut at its last ``####`` (chapter 8: DRO replaces the
        answer by the reference ``"\\n#### <gold>"`` after the reasoning). The reasoning drops the
        whitespace right before the marker; the answer is the stripped text after it, ``None`` (and the
        whole text is reasoning) when there is no marker. Never raises on a string."""
        if not isinstance(completion, str):
            raise ValueError(f"completion must be a string, got {type(completion).__name__}")
        cut = completion.rfind("####")
        if cut < 0:
            return completion, None
        return completion[:cut].rstrip(), completion[cut + 4:].strip()

    def _score(self, problem: Problem, completion: str) -> Reward:
        return gsm8k_reward(completion, problem.answer, require_marker=self.require_marker)
