"""Tasks by name (chapter 4, *The variance audit*): ``get_task("gsm8k", data_dir=...)``.

Built-in names: ``arithmetic`` (the tiny world), ``gsm8k``, ``math`` (train on MATH levels 3-5, test on MATH-500), ``math500``,
``math_l3to5`` and ``countdown``. Other modules add theirs with :func:`register_task`.
"""

from __future__ import annotations

from typing import Callable

from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.tasks.base import Task
from rlcurate.tasks.countdown import Countdown
from rlcurate.tasks.gsm8k import GSM8K
from rlcurate.tasks.math import MATH, MATH500, MATHLevel3to5

__all__ = ["get_task", "register_task", "available_tasks"]

_REGISTRY: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "gsm8k": GSM8K,
    "math": MATH,
    "math500": MATH500,
    "math_l3to5": MATHLevel3to5,
    "countdown": Countdown,
}


def available_tasks() -> list[str]:
    """The names :func:`get_task` knows, sorted (chapter 4)."""
    return sorted(_REGISTRY)


def register_task(name: str, factory: Callable[..., Task], overwrite: bool = False) -> None:
    """Make ``get_task(name, **kwargs)`` return ``factory(**kwargs)`` (chapter 4).

    Raises ``ValueError`` for an empty or non-string ``name``, a ``factory`` that is not callable, or
    a name already taken (unless ``overwrite``).
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
        raise ValueError(f"name must be a non-empty lower-case string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory must be callable, got {factory!r}")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not factory:
        raise ValueError(f"name={name!r} is already registered (to {_REGISTRY[name]!r}); pass overwrite=True")
    _REGISTRY[name] = factory


def get_task(name: str, **kwargs) -> Task:
    """The task called ``name`` (case-insensitive), built with ``kwargs`` (chapter 4).

    Raises ``ValueError`` naming the unknown name and listing the known ones.
    """
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in _REGISTRY:
        raise ValueError(f"name={name!r} is not a known task; known tasks: {', '.join(available_tasks())}")
    return _REGISTRY[key](**kwargs)
