"""Verifiers for GSM8K, MATH and Countdown (chapter 4, *The variance audit*).

A verifier maps a completion ``a`` of prompt ``x`` to a reward r(x, a) in [0, 1]. Model text is
arbitrary, so none of the ``*_reward`` functions here raises on it: unparseable text scores 0 and the
reason is returned in :attr:`~rlcurate.tasks.base.Reward.reason` (and logged at debug level). Gold
answers come from datasets, not models, so a bad gold answer is a ``ValueError``.

* GSM8K: the number after the last ``####``, else the last ``\\boxed{}``, else the last number in
  the text, compared numerically (exact rational arithmetic) with the gold number.
* MATH: the last ``\\boxed{}`` answer; a string-normalised exact match is accepted at once, otherwise
  ``math-verify`` decides symbolic equivalence (``\\frac{1}{2}`` equals ``0.5``). Its ``signal.alarm``
  timeouts only work in the main thread, so elsewhere they are switched off and the text handed to it
  is bounded in length instead.
* Countdown: the equation inside the last ``<answer>...</answer>``; every given number used exactly
  once; only integers, ``+ - * /`` and parentheses, evaluated exactly by an AST walker (never
  ``eval``). Reward 1 when it equals the target, ``format_score`` (default 0) for an answer that is
  present but wrong.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
import threading
from collections import Counter
from fractions import Fraction
from typing import Sequence

from rlcurate.tasks.base import Reward

log = logging.getLogger(__name__)

__all__ = [
    "VerifierArgumentError",
    "parse_number",
    "extract_gsm8k_answer",
    "gsm8k_reward",
    "extract_boxed",
    "normalize_math_answer",
    "math_reward",
    "extract_answer_tag",
    "evaluate_arithmetic",
    "countdown_reward",
]

# A number as people and models write it: optional minus, thousands separators, decimals.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?![\d,])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
_MAX_NUMBER_CHARS = 40  # longer digit runs are not answers (and int() refuses > 4300 digits)


def _zero(reason: str) -> Reward:
    log.debug("reward 0: %s", reason)
    return Reward(0.0, reason)


class VerifierArgumentError(ValueError):
    """A bad argument that does not come from the model (a gold answer, a parameter; chapter 4):
    raised, not scored."""


def _safe(fn):
    """Wrap a verifier so that an unexpected failure on model text scores 0 instead of raising."""

    @functools.wraps(fn)
    def wrapper(completion, *args, **kwargs):
        if not isinstance(completion, str):
            return _zero(f"completion is {type(completion).__name__}, not str")
        try:
            return fn(completion, *args, **kwargs)
        except VerifierArgumentError:
            raise
        except Exception as exc:  # never let model text kill a run
            return _zero(f"verifier error: {type(exc).__name__}: {exc}")

    return wrapper


# ----------------------------------------------------------------------------------------------
# GSM8K
# ----------------------------------------------------------------------------------------------
def parse_number(text: str) -> Fraction | None:
    """The value of a number written as ``-1,234.50``, ``$18``, ``18.`` or ``50%`` as an exact
    :class:`~fractions.Fraction`, or ``None`` if ``text`` is not exactly one such number (chapter 4)."""
    if not isinstance(text, str):
        return None
    s = text.strip().replace("$", "").replace("\\", "").strip()
    s = s.rstrip(".").rstrip("%").strip()
    if len(s) > _MAX_NUMBER_CHARS or not _NUMBER.fullmatch(s):
        return None
    return Fraction(s.replace(",", ""))


def _numbers(text: str) -> list[tuple[int, str]]:
    """(position, string) of every number in ``text``; a minus sign right after a digit, a letter
    or a closing bracket is read as subtraction, not as a sign."""
    out = []
    for m in _NUMBER.finditer(text):
        s, start = m.group(), m.start()
        if s.startswith("-") and start > 0 and (text[start - 1].isalnum() or text[start - 1] in ")]}"):
            s, start = s[1:], start + 1
        if len(s) <= _MAX_NUMBER_CHARS:
            out.append((start, s))
    return out


def extract_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """The final numeric answer of a GSM8K-style completion and how it was found (chapter 4).

    Order of preference: the first number after the last ``####``; the last number inside the last
    ``\\boxed{}``; the last number anywhere. Returns ``(number_string, how)``, or ``(None, why)``.
    """
    if not isinstance(text, str):
        return None, f"completion is {type(text).__name__}, not str"
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _numbers(tail)
        if found:
            return found[0][1], "after ####"
    boxed = extract_boxed(text)
    if boxed is not None:
        found = _numbers(boxed)
        if found:
            return found[-1][1], "in \\boxed{}"
    found = _numbers(text)
    if found:
        return found[-1][1], "last number"
    return None, "no number in completion"


@_safe
def gsm8k_reward(completion: str, gold: str, require_marker: bool = False) -> Reward:
    """r = 1 if the completion's final number equals ``gold`` numerically, else 0 (chapter 4).

    ``require_marker=True`` scores only answers written after ``####`` (strict format). ``gold`` must
    be a number (commas, ``$`` allowed); otherwise ``ValueError``. Never raises on ``completion``.
    """
    gold_value = parse_number(gold) if isinstance(gold, str) else None
    if gold_value is None:
        raise VerifierArgumentError(f"gold must be a number as a string, got {gold!r}")
    pred, how = extract_gsm8k_answer(completion)
    if pred is None:
        return _zero(how)
    if require_marker and how != "after ####":
        return _zero(f"no number after '####' (found {pred!r} as {how})")
    value = Fraction(pred.replace(",", ""))
    if value == gold_value:
        return Reward(1.0, f"correct: {pred} ({how})")
    return Reward(0.0, f"wrong: {pred} ({how}) != {gold}")


# ----------------------------------------------------------------------------------------------
# MATH
# ----------------------------------------------------------------------------------------------
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def _brace_partners(text: str) -> dict[int, int]:
    """Position of each unescaped ``{`` mapped to its matching ``}``, in one pass."""
    partners, stack = {}, []
    for j, c in enumerate(text):
        if c in "{}" and (j == 0 or text[j - 1] != "\\"):
            if c == "{":
                stack.append(j)
            elif stack:
                partners[stack.pop()] = j
    return partners


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``,
    with nested braces balanced; ``None`` if there is none or it is unclosed (chapter 4).

    Linear in the length of ``text``, however many unclosed boxes it holds."""
    if not isinstance(text, str):
        return None
    matches = list(_BOXED.finditer(text))
    partners = None
    for m in reversed(matches):
        i = m.end()
        if i < len(text) and text[i] == "{":
            if partners is None:
                partners = _brace_partners(text)
            j = partners.get(i)
            if j is not None:
                return text[i + 1 : j].strip()
            continue  # unclosed: try an earlier one
        if m.group() != m.group().rstrip():  # "\\boxed 5": the next word
            word = re.match(r"[^\s$]+", text[i:])
            if word:
                return word.group().rstrip(".").strip()
    return None


_NORM_DROP = (
    r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\ ", r"\displaystyle", "^\\circ", "^{\\circ}", r"\%", "%", "$",
)


def normalize_math_answer(answer: str) -> str:
    """A canonical string form of a MATH answer for the exact-match fast path (chapter 4).

    Drops ``$``, spacing commands, ``\\left``/``\\right``, degree and percent signs, ``\\text{}``
    wrappers, a trailing period and all whitespace; ``\\dfrac``/``\\tfrac`` become ``\\frac``. Two
    answers with the same normal form are equal; different forms are left to ``math-verify``.
    """
    s = answer.strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    for token in _NORM_DROP:
        s = s.replace(token, "")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, use_timeout: bool):
    from math_verify import parse

    return parse(f"\\boxed{{{gold}}}", parsing_timeout=5 if use_timeout else None)


@_safe
def math_reward(completion: str, gold: str, max_chars: int = 4000) -> Reward:
    """r = 1 if the completion's final answer is mathematically equal to ``gold``, else 0 (chapter 4).

    The answer is the last ``\\boxed{}`` of the completion; a match of :func:`normalize_math_answer`
    forms scores 1 without any parsing. Otherwise ``math-verify`` compares the boxed answer (or, with
    no box, the last ``max_chars`` characters of the completion) with ``gold`` symbolically. In the
    main thread its 5-second ``signal.alarm`` timeouts apply; in any other thread they are off (they
    would raise there) and ``max_chars`` bounds the work instead. Never raises on ``completion``.
    """
    if not isinstance(gold, str) or not gold.strip():
        raise VerifierArgumentError(f"gold must be a non-empty string, got {gold!r}")
    if not isinstance(max_chars, int) or max_chars < 1:
        raise VerifierArgumentError(f"max_chars must be a positive integer, got {max_chars!r}")
    boxed = extract_boxed(completion)
    if boxed is not None and normalize_math_answer(boxed) == normalize_math_answer(gold):
        return Reward(1.0, "correct: exact match of \\boxed{} answer")
    if boxed is not None:
        if len(boxed) > max_chars:
            return _zero(f"\\boxed{{}} answer longer than {max_chars} characters")
        candidate = f"\\boxed{{{boxed}}}"
    else:
        if not completion.strip():
            return _zero("empty completion")
        candidate = completion[-max_chars:]

    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    gold_parsed = _parse_gold(gold.strip(), main)
    if not gold_parsed:
        raise VerifierArgumentError(f"gold={gold!r} could not be parsed by math-verify")
    pred_parsed = parse(candidate, parsing_timeout=5 if main else None)
    if not pred_parsed:
        return _zero("no answer found" if boxed is None else f"could not parse \\boxed{{{boxed[:60]}}}")
    ok = verify(gold_parsed, pred_parsed, timeout_seconds=5 if main else None)
    shown = pred_parsed[-1] if len(pred_parsed) > 1 else pred_parsed[0]
    where = "\\boxed{}" if boxed is not None else "no \\boxed{}, last expression"
    if ok:
        return Reward(1.0, f"correct: equivalent by math-verify ({where})")
    return Reward(0.0, f"wrong: {str(shown)[:80]} ({where}) != {gold}")


# ----------------------------------------------------------------------------------------------
# Countdown
# ----------------------------------------------------------------------------------------------
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "\u2217": "*", "\u00b7": "*"})


def extract_answer_tag(text: str) -> str | None:
    """The stripped text between the last ``</answer>`` and the ``<answer>`` nearest before it, or
    ``None`` when there is no such pair (chapter 4). Linear in the length of ``text``."""
    if not isinstance(text, str):
        return None
    close = None
    for close in _CLOSE_TAG.finditer(text):
        pass
    if close is None:
        return None
    start = None
    for start in _OPEN_TAG.finditer(text, 0, close.start()):
        pass
    if start is None:
        return None
    return text[start.end() : close.start()].strip()


def evaluate_arithmetic(expr: str, max_chars: int = 200, max_digits: int = 6) -> tuple[Fraction, list[int]]:
    """Evaluate an arithmetic expression exactly, without ``eval`` (chapter 4).

    Only non-negative integer literals of at most ``max_digits`` digits, the binary operators
    ``+ - * /`` and parentheses are allowed (no unary minus, no powers, no names), and the text must
    be at most ``max_chars`` long, so the value and the work stay small. ``×``, ``÷`` and ``−`` are
    read as ``*``, ``/`` and ``-``. Returns ``(value, literals in order)``. Raises ``ValueError`` for
    anything else, including division by zero.
    """
    if not isinstance(expr, str):
        raise ValueError(f"expr must be a string, got {type(expr).__name__}")
    if len(expr) > max_chars:
        raise ValueError(f"expression longer than {max_chars} characters")
    text = expr.translate(_SYMBOLS).strip()
    if not text:
        raise ValueError("empty expression")
    if not re.fullmatch(r"[\d\s+\-*/()]+", text):
        bad = sorted(set(re.sub(r"[\d\s+\-*/()]", "", text)))
        raise ValueError(f"characters not allowed: {''.join(bad)[:20]!r}")
    if "**" in text or "//" in text:
        raise ValueError("only + - * / are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a valid expression ({exc.msg})") from None
    literals: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            op = type(node.op)
            if op is ast.Add:
                return left + right
            if op is ast.Sub:
                return left - right
            if op is ast.Mult:
                return left * right
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if len(str(node.value)) > max_digits:
                raise ValueError(f"number with more than {max_digits} digits")
            literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp):
            raise ValueError("unary operators are not allowed")
        raise ValueError(f"{type(node).__name__} is not allowed")

    return walk(tree.body), literals


def _equation_side(answer: str) -> str:
    """The expression part of an answer that may be written as an equation (``expr = 55``)."""
    if "=" not in answer:
        return answer
    parts = [p.strip() for p in answer.split("=")]
    if len(parts) != 2:
        raise ValueError("more than one '=' in the answer")
    left, right = parts
    if re.fullmatch(r"\d+", right):
        return left
    if re.fullmatch(r"\d+", left):
        return right
    raise ValueError("an equation needs a plain number on one side")


@_safe
def countdown_reward(
    completion: str,
    numbers: Sequence[int],
    target: int,
    format_score: float = 0.0,
) -> Reward:
    """r = 1 if the equation in the last ``<answer>`` tag uses each of ``numbers`` exactly once and
    equals ``target`` (chapter 4).

    A completion with an ``<answer>`` tag that fails (wrong numbers, bad syntax, wrong value) scores
    ``format_score``: 0 by default (binary reward), 0.1 for the graded reward of TinyZero and INSIGHT.
    An answer may be written as ``expression`` or ``expression = target``. Never raises on ``completion``.
    """
    if isinstance(numbers, (str, bytes)) or not all(type(n) is int for n in numbers) or not numbers:
        raise VerifierArgumentError(f"numbers must be a non-empty sequence of integers, got {numbers!r}")
    if type(target) is not int:
        raise VerifierArgumentError(f"target must be an integer, got {target!r}")
    if isinstance(format_score, bool) or not isinstance(format_score, (int, float)) or not 0 <= format_score < 1:
        raise VerifierArgumentError(f"format_score must be a number in [0, 1), got {format_score!r}")
    answer = extract_answer_tag(completion)
    if answer is None:
        return _zero("no <answer>...</answer> tag")

    def partial(reason: str) -> Reward:
        log.debug("countdown reward %s: %s", format_score, reason)
        return Reward(float(format_score), reason)

    try:
        expr = _equation_side(answer)
        value, used = evaluate_arithmetic(expr)
    except ValueError as exc:
        return partial(f"invalid expression {answer[:60]!r}: {exc}")
    if Counter(used) != Counter(numbers):
        return partial(f"uses {sorted(used)}, must use each of {sorted(numbers)} exactly once")
    if value != target:
        return partial(f"{expr[:60]} = {value}, not {target}")
    return Reward(1.0, f"correct: {expr[:60]} = {target}")
