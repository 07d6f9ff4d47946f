"""Curation strategies by name (``strategy`` in a training config).

A name maps to a factory that builds a :class:`~rlcurate.curation.base.Curator` from keyword arguments
(its paper's defaults otherwise). ``a+b`` composes the selector of strategy ``a`` with the sampler and
processors of strategy ``b``, e.g. ``insight+ada_seq_balanced``.

:func:`validate_strategy` checks a name and its keyword arguments against the factories' signatures
without building anything, so a typo fails before a model loads; a misspelt name gets the closest
registered ones as suggestions. Both it and :func:`build_curator` raise
:class:`~rlcurate.errors.UserError` for bad input.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

from rlcurate.curation.base import Curator
from rlcurate.errors import UserError

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


def close_matches(word: str, choices) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the choices closest to ``word``, else an empty string."""
    near = difflib.get_close_matches(str(word), list(choices), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""


def accepted_kwargs(factory: Callable) -> set[str] | None:
    """The keyword arguments ``factory`` takes (``None``: any, it has ``**kwargs``)."""
    params = inspect.signature(factory).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return {k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _check_kwargs(name: str, kwargs: dict, label: str) -> None:
    accepted = accepted_kwargs(_REGISTRY[name])
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        hint = close_matches(unknown[0], accepted)
        takes = ", ".join(sorted(accepted)) or "no keyword arguments"
        raise UserError(f"{label}: strategy {name!r} does not take {', '.join(unknown)}{hint}; it takes {takes}")


def _split_kwargs(names: list[str], kwargs: dict) -> list[dict]:
    """Keyword arguments of each part of ``a+b``: ``kwargs[a]`` when given as a mapping, else the flat
    keys that part takes; a flat key that no part takes is an error."""
    if len(names) == 1:
        return [dict(kwargs)]
    flat = {k: v for k, v in kwargs.items() if k not in names}
    parts, taken, takes = [], set(), set()
    for n in names:
        if n in kwargs:
            if not isinstance(kwargs[n], dict):
                raise UserError(f"strategy_kwargs.{n} must be a mapping, got {kwargs[n]!r}")
            parts.append(dict(kwargs[n]))
            continue
        accepted = accepted_kwargs(_REGISTRY[n])
        kw = dict(flat) if accepted is None else {k: v for k, v in flat.items() if k in accepted}
        taken |= set(kw)
        takes |= accepted or set()
        parts.append(kw)
    unknown = sorted(set(flat) - taken)
    if unknown:
        raise UserError(f"strategy_kwargs: no part of {'+'.join(names)} takes {', '.join(unknown)}"
                        f"{close_matches(unknown[0], takes | set(names))}; flat keys it takes: "
                        f"{', '.join(sorted(takes)) or 'none'} (or give {{{names[0]}: {{...}}, {names[1]}: {{...}}}})")
    return parts


def validate_strategy(strategy: Any, kwargs: Any = None) -> list[tuple[str, dict]]:
    """Check a strategy name (``a`` or ``a+b``) and its keyword arguments without building it.

    Returns ``[(name, kwargs), ...]``, one pair per part. Raises :class:`~rlcurate.errors.UserError`
    for an unknown name (with the closest registered names), more than two parts, keyword arguments
    that are not a mapping, or keyword arguments a factory does not take.
    """
    _load_builtins()
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(strategy, str) or not strategy.strip():
        raise UserError(f"strategy must be a name such as 'uniform' or 'insight+ada_seq_balanced', got {strategy!r}")
    if not isinstance(kwargs, dict):
        raise UserError(f"strategy_kwargs must be a mapping, got {kwargs!r}")
    names = [s.strip() for s in strategy.split("+")]
    for n in names:
        if n not in _REGISTRY:
            raise UserError(f"unknown strategy {n!r}{close_matches(n, _REGISTRY)}; available: "
                            f"{', '.join(sorted(_REGISTRY))} (or a+b: the selector of a with the sampler of b)")
    if len(names) > 2:
        raise UserError(f"strategy {strategy!r}: compose at most two strategies (selector+sampler)")
    parts = _split_kwargs(names, kwargs)
    for n, kw in zip(names, parts):
        _check_kwargs(n, kw, "strategy_kwargs" if len(names) == 1 else f"strategy_kwargs for {n}")
    return list(zip(names, parts))


def _call(name: str, kwargs: dict) -> Curator:
    try:
        return _REGISTRY[name](**kwargs)
    except UserError:
        raise
    except (ValueError, TypeError) as exc:  # a factory rejecting a value (or its type) the user gave
        raise UserError(f"strategy {name!r}, strategy_kwargs {kwargs}: {exc}") from exc


def build_curator(strategy: str, **kwargs) -> Curator:
    """Build the curator named ``strategy`` (see :func:`available`). For ``a+b``, keyword arguments
    may be split as ``{a: {...}, b: {...}}`` or given flat (then each part takes the ones it knows).
    Bad names or arguments raise :class:`~rlcurate.errors.UserError` (:func:`validate_strategy`)."""
    parts = [_call(n, kw) for n, kw in validate_strategy(strategy, kwargs)]
    if len(parts) == 1:
        return parts[0]
    first, second = parts
    return Curator(first.selector, second.sampler, second.processors, name=strategy)


BUILTIN_MODULES = ("strategies", "dapo", "prefilter", "ada", "gvm", "selection", "sage", "dro")


def _load_builtins() -> None:
    """Importing the strategy modules registers them."""
    import importlib

    for mod in BUILTIN_MODULES:
        importlib.import_module(f"rlcurate.curation.{mod}")
