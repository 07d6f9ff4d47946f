"""Curation strategies by name (``strategy`` in a training config).

A name maps to a factory that builds a :class:`~rlcurate.curation.base.Curator` from keyword arguments
(its paper's defaults otherwise). ``a+b`` composes the selector of strategy ``a`` with the sampler and
processors of strategy ``b``, e.g. ``insight+ada_seq_balanced``.
"""

from __future__ import annotations

import inspect
from typing import Callable

from rlcurate.curation.base import Curator

_REGISTRY: dict[str, Callable[..., Curator]] = {}


def register(name: str):
    """Decorator: register a factory ``f(**kwargs) -> Curator`` under ``name``."""
    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"strategy {name!r} is registered twice")
        _REGISTRY[name] = fn
        return fn
    return deco


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _call(name: str, kwargs: dict) -> Curator:
    factory = _REGISTRY[name]
    params = inspect.signature(factory).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ValueError(f"strategy {name!r} does not take {unknown}; it takes {sorted(params)}")
    return factory(**kwargs)


def build_curator(strategy: str, **kwargs) -> Curator:
    """Build the curator named ``strategy`` (see :func:`available`). For ``a+b``, keyword arguments
    may be split as ``{a: {...}, b: {...}}`` or given flat (then each part takes the ones it knows)."""
    _load_builtins()
    names = [s.strip() for s in strategy.split("+")]
    for n in names:
        if n not in _REGISTRY:
            raise ValueError(f"unknown strategy {n!r}; available: {', '.join(sorted(_REGISTRY))}")
    if len(names) == 1:
        return _call(names[0], kwargs)
    if len(names) != 2:
        raise ValueError(f"compose at most two strategies (selector+sampler), got {strategy!r}")
    parts = []
    for n in names:
        if n in kwargs and isinstance(kwargs[n], dict):
            kw = kwargs[n]
        else:
            params = inspect.signature(_REGISTRY[n]).parameters
            kw = {k: v for k, v in kwargs.items() if k in params}
        parts.append(_call(n, kw))
    first, second = parts
    return Curator(first.selector, second.sampler, second.processors, name=strategy)


BUILTIN_MODULES = ("strategies", "dapo", "prefilter", "ada", "gvm", "selection", "sage", "dro")


def _load_builtins() -> None:
    """Importing the strategy modules registers them."""
    import importlib

    for mod in BUILTIN_MODULES:
        importlib.import_module(f"rlcurate.curation.{mod}")
