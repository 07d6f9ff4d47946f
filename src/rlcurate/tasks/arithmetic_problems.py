"""The problems of the arithmetic task (chapter 4): difficulty levels, reference solutions (the
scratchpads that serve as hints in chapter 7 and as DRO's reference answers in chapter 8) and the
train/test split by a hash of the operands. :mod:`rlcurate.tasks.arithmetic` renders and scores them.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

import numpy as np

OPS = {"add": "+", "sub": "-", "mul": "*"}

_LEVEL_RE = re.compile(r"^(add|sub|mul)(\d)(?:x(\d))?$")


@dataclass(frozen=True)
class Level:
    """A difficulty level: operator ``op`` and the digit counts of the two operands (chapter 4).

    One-digit operands range over 0-9, d-digit operands over [10^(d-1), 10^d - 1].
    """

    op: str
    digits_a: int
    digits_b: int

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, got {self.op!r}")
        for name in ("digits_a", "digits_b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 9:
                raise ValueError(f"{name} must be an integer in 1..9, got {value!r}")
        if self.op == "sub" and self.digits_a < self.digits_b:
            raise ValueError(
                f"subtraction needs digits_a >= digits_b (results are non-negative), "
                f"got digits_a={self.digits_a}, digits_b={self.digits_b}"
            )

    @property
    def name(self) -> str:
        """``"add3"`` for equal digit counts, ``"mul2x1"`` otherwise."""
        if self.digits_a == self.digits_b:
            return f"{self.op}{self.digits_a}"
        return f"{self.op}{self.digits_a}x{self.digits_b}"

    @classmethod
    def parse(cls, spec) -> "Level":
        """A :class:`Level` from ``"add3"``, ``"mul2x1"``, a ``(op, digits_a, digits_b)`` tuple or a
        Level (chapter 4)."""
        if isinstance(spec, Level):
            return spec
        if isinstance(spec, str):
            m = _LEVEL_RE.match(spec.strip())
            if not m:
                raise ValueError(f"level must look like 'add3' or 'mul2x1', got {spec!r}")
            da = int(m.group(2))
            db = int(m.group(3)) if m.group(3) else da
            return cls(m.group(1), da, db)
        if isinstance(spec, (tuple, list)) and len(spec) == 3:
            return cls(*spec)
        raise ValueError(f"level must be a string like 'add3', a (op, digits_a, digits_b) tuple or a Level, got {spec!r}")

    def operand_range(self, which: str) -> tuple[int, int]:
        """Inclusive range of operand ``which`` (``"a"`` or ``"b"``) (chapter 4)."""
        d = self.digits_a if which == "a" else self.digits_b
        return (0, 9) if d == 1 else (10 ** (d - 1), 10**d - 1)

    def size(self) -> int:
        """Number of operand pairs (a, b) of this level (chapter 4); subtraction counts pairs with a >= b."""
        (la, ha), (lb, hb) = self.operand_range("a"), self.operand_range("b")
        if self.op == "sub" and self.digits_a == self.digits_b:
            n = ha - la + 1
            return n * (n + 1) // 2
        return (ha - la + 1) * (hb - lb + 1)


# ----------------------------------------------------------------------------------------------
# Reference solutions
# ----------------------------------------------------------------------------------------------


def _digits(n: int) -> list[int]:
    """Decimal digits of n >= 0, least significant first."""
    return [int(c) for c in reversed(str(n))]


def solve(op: str, a: int, b: int) -> tuple[tuple[str, ...], str]:
    """The scratchpad steps and the final answer of ``a op b`` (chapter 4; the steps are the hints
    of chapter 7). Operands are non-negative integers; subtraction needs ``a >= b``."""
    if op not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)}, got {op!r}")
    for name, v in (("a", a), ("b", b)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    a, b = int(a), int(b)
    steps: list[str] = []
    if op == "add":
        da, db = _digits(a), _digits(b)
        n = max(len(da), len(db))
        da, db = da + [0] * (n - len(da)), db + [0] * (n - len(db))
        carry = 0
        for x, y in zip(da, db):
            s = x + y + carry
            steps.append(f"{x}+{y}+{carry}={s}")
            carry = s // 10
        return tuple(steps), str(a + b)
    if op == "sub":
        if a < b:
            raise ValueError(f"subtraction needs a >= b, got a={a}, b={b}")
        da, db = _digits(a), _digits(b)
        db = db + [0] * (len(da) - len(db))
        borrow = 0
        for x, y in zip(da, db):
            if x - y - borrow < 0:
                steps.append(f"1{x}-{y}-{borrow}={10 + x - y - borrow}")
                borrow = 1
            else:
                steps.append(f"{x}-{y}-{borrow}={x - y - borrow}")
                borrow = 0
        return tuple(steps), str(a - b)
    # multiplication
    if b < 10:
        carry = 0
        for x in _digits(a):
            v = x * b + carry
            steps.append(f"{x}*{b}+{carry}={v}")
            carry = v // 10
        return tuple(steps), str(a * b)
    partials = []
    for j, y in enumerate(_digits(b)):
        factor = y * 10**j
        partials.append(a * factor)
        steps.append(f"{a}*{factor}={a * factor}")
    acc = partials[0]
    for p in partials[1:]:
        steps.append(f"{acc}+{p}={acc + p}")
        acc += p
    return tuple(steps), str(a * b)


# ----------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------


def _unit_hash(key: str) -> float:
    """A stable hash of ``key`` in [0, 1) (independent of Python's per-process hash seed)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@functools.lru_cache(maxsize=1 << 18)  # every task built enumerates its levels' pairs again: ~60k hashes a task
def split_of(op: str, a: int, b: int, test_fraction: float = 0.2) -> str:
    """``"test"`` or ``"train"`` for the problem ``a op b``, decided by a hash of the operands
    (chapter 4). For the commutative ``add`` and ``mul``, ``a op b`` and ``b op a`` share a split,
    so a held-out problem is never seen in training with its operands swapped."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    if op in ("add", "mul"):
        a, b = min(a, b), max(a, b)
    return "test" if _unit_hash(f"{op}:{a}:{b}") < test_fraction else "train"


def stable_seed(*parts) -> list[int]:
    """An entropy list for numpy's SeedSequence built from ints and strings, stable across runs."""
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append(int.from_bytes(hashlib.blake2b(p.encode(), digest_size=4).digest(), "big"))
        else:
            out.append(int(p))
    return out


# ----------------------------------------------------------------------------------------------
# Completions
# ----------------------------------------------------------------------------------------------
