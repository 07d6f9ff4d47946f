"""Tasks by name (chapter 4, *The variance audit*): ``get_task("gsm8k", data_dir=...)``.

Built-in names: ``arithmetic`` (the tiny world), ``gsm8k``, ``math`` (train on MATH levels 3-5, test on MATH-500), ``math500``,
``math_l3to5`` and ``countdown``. Other modules add theirs with :func:`register_task`.
:func:`validate_task` checks a name and its keyword arguments against the factory's signature
without building the task (no data is read), so a training run refuses a typo before its model loads.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

from rlcurate.errors import UserError

from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.tasks.base import Task
from rlcurate.tasks.countdown import Countdown
from rlcurate.tasks.gsm8k import GSM8K
from rlcurate.tasks.math import MATH, MATH500, MATHLevel3to5

__all__ = ["get_task", "register_task", "available_tasks", "validate_task"]

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


def _accepted_kwargs(factory: Callable) -> set[str] | None:
    """Keyword arguments ``factory`` takes, following ``**kwargs`` up a class's ``__init__`` chain
    (``None``: anything)."""
    chain = [k.__dict__["__init__"] for k in factory.__mro__ if "__init__" in k.__dict__] \
        if isinstance(factory, type) else [factory]
    names: set[str] = set()
    for fn in chain:
        if fn is object.__init__:
            return names
        params = list(inspect.signature(fn).parameters.values())[1 if isinstance(factory, type) else 0:]
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return names
    return None


def _key(name: Any) -> str:
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in _REGISTRY:
        near = difflib.get_close_matches(str(name), list(_REGISTRY), n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
        raise UserError(f"name={name!r} is not a known task; known tasks: {', '.join(available_tasks())}{hint}")
    return key


def validate_task(name: str, kwargs: Any = None) -> None:
    """Check a task name and its keyword arguments without building the task (chapter 4).

    Raises :class:`~rlcurate.errors.UserError` for an unknown name (with the closest known ones),
    keyword arguments that are not a mapping, or keys the task's constructor does not take.
    """
    factory = _REGISTRY[_key(name)]
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise UserError(f"task_kwargs must be a mapping, got {kwargs!r}")
    accepted = _accepted_kwargs(factory)
    unknown = sorted(set(kwargs) - accepted) if accepted is not None else []
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(accepted), n=1, cutoff=0.6)
        raise UserError(f"task_kwargs: task {name!r} does not take {', '.join(unknown)}"
                        f"{f' (did you mean {near[0]!r}?)' if near else ''}; it takes {', '.join(sorted(accepted))}")


def get_task(name: str, **kwargs) -> Task:
    """The task called ``name`` (case-insensitive), built with ``kwargs`` (chapter 4).

    Raises :class:`~rlcurate.errors.UserError` (a ``ValueError``) naming an unknown name and listing
    the known ones, an argument the task does not take, or a value its constructor rejects.
    """
    validate_task(name, kwargs)
    try:
        return _REGISTRY[_key(name)](**kwargs)
    except UserError:
        raise
    except (ValueError, TypeError) as exc:  # the constructor rejecting a value (or its type) the user gave
        raise UserError(f"task {name!r}, task_kwargs {kwargs}: {exc}") from exc
