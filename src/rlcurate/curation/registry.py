"""Curation strategies by name (``strategy`` in a training config).

A strategy is a configuration dataclass registered under its name: its fields are the options
(``strategy_kwargs``), each documented by the string right below it, and its :meth:`~StrategyConfig.build`
returns the :class:`~rlcurate.curation.base.Curator`::

    @register("uniform")
    @dataclass
    class UniformConfig(StrategyConfig):
        \"\"\"The GRPO baseline: ...\"\"\"

        def build(self) -> Curator:
            return Curator(Selector(), Sampler(), name=self.name)

The class docstring describes the strategy (its first paragraph is the one-line summary of
``rlcurate strategies``), the field docstrings its options (``rlcurate strategies NAME``). Every
option needs a default. How to add a strategy, with a worked example: ``src/rlcurate/curation/README.md``.

Names are found lazily: the first lookup (:func:`available`, :func:`validate_strategy`,
:func:`build_curator`, :func:`config_class`) imports every module of the package
``rlcurate.curation`` (``pkgutil.iter_modules`` over its ``__path__``; names starting with ``_``
are skipped), so a new file in that folder is registered with nothing else edited; no list of
modules is kept by hand. No strategy module imports torch, so ``build_curator("uniform")`` needs
numpy alone. A strategy kept outside the package is found the same way from the environment variable
``RLCURATE_STRATEGIES`` (files ``path/to/mine.py`` or module names, separated by ``os.pathsep``), which
``rlcurate runs`` passes on to its runs, or from an installed package's entry point in the group
``rlcurate.strategies``.

``a+b`` composes the selector of strategy ``a`` with the sampler and processors of strategy ``b``,
e.g. ``insight+ada_seq_balanced``. :func:`validate_strategy` checks a name and its keyword arguments
against the configuration fields without building anything, so a typo fails before a model loads;
a misspelt name gets the closest registered ones as suggestions. Both it and :func:`build_curator`
raise :class:`~rlcurate.errors.UserError` for bad input. A rejected value (``ValueError`` or
``TypeError`` from :meth:`~StrategyConfig.build`, where the parts' constructors check their
arguments) becomes a :class:`~rlcurate.errors.UserError` naming the strategy and its kwargs.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any, ClassVar

from rlcurate.curation.base import Curator
from rlcurate.errors import UserError

__all__ = ["StrategyConfig", "register", "available", "config_class", "options", "validate_strategy",
           "build_curator", "close_matches"]


class StrategyConfig:
    """The base of a strategy's configuration: subclass it as a ``@dataclass`` whose fields are the
    strategy's options (each with a docstring below it) and register it with :func:`register`."""

    name: ClassVar[str] = ""
    """The registered name (set by :func:`register`)."""

    def build(self) -> Curator:
        """The curator of this configuration (a fresh one on every call)."""
        raise NotImplementedError


_REGISTRY: dict[str, type[StrategyConfig]] = {}
_IMPORTED: set[str] = set()  # what discovery has imported: the package's modules, plugin entries, entry points
PLUGINS_ENV = "RLCURATE_STRATEGIES"
"""Strategies outside the package: files (``path/to/mine.py``) or importable module names, ``os.pathsep``-separated."""
ENTRY_POINT_GROUP = "rlcurate.strategies"


def register(name: str):
    """Class decorator: register the configuration dataclass ``cls`` (a :class:`StrategyConfig`)
    under ``name`` and set ``cls.name``. Put it above ``@dataclass``."""
    def deco(cls):
        if not (isinstance(cls, type) and issubclass(cls, StrategyConfig)
                and "__dataclass_fields__" in cls.__dict__):
            raise TypeError(f"register({name!r}) needs a @dataclass subclass of StrategyConfig, got {cls!r}")
        if (cls.__doc__ or "").startswith(f"{cls.__name__}("):  # @dataclass wrote its signature: no docstring
            raise TypeError(f"strategy {name!r}: {cls.__name__} needs a docstring (the strategy's description)")
        for f in dataclasses.fields(cls):
            if f.name == "name" or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
                raise TypeError(f"strategy {name!r}: option {f.name!r} needs a default (and may not be called 'name')")
        old = _REGISTRY.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__) \
                and (old.__qualname__, _source(old)) != (cls.__qualname__, _source(cls)):
            raise ValueError(f"strategy {name!r} is registered twice ({old.__module__}.{old.__qualname__} "
                             f"and {cls.__module__}.{cls.__qualname__})")
        if not isinstance(name, str) or not name or "+" in name or name != name.strip():
            raise TypeError(f"register({name!r}): a strategy's name is a word without '+' (which composes two "
                            f"strategies, selector+sampler) or surrounding spaces")
        cls.name = name
        _REGISTRY[name] = cls  # the same class re-imported (a module reloaded) replaces itself
        return cls
    return deco


def _source(cls) -> Path | None:
    """The file that defines ``cls``: a strategy file imported both through :data:`PLUGINS_ENV` and by its module
    name registers one strategy, not two."""
    try:
        return Path(inspect.getsourcefile(cls)).resolve()
    except (TypeError, OSError):
        return None


def _discover() -> None:
    """Import the modules of ``rlcurate.curation`` not imported yet (their decorators register), then the
    strategies outside it (:data:`PLUGINS_ENV`, the entry points of :data:`ENTRY_POINT_GROUP`)."""
    import rlcurate.curation as package

    for info in pkgutil.iter_modules(package.__path__):
        module = f"{package.__name__}.{info.name}"
        if info.name.startswith("_") or module in _IMPORTED:
            continue
        _import_once(module, lambda module=module: importlib.import_module(module))
    for entry in filter(None, (e.strip() for e in os.environ.get(PLUGINS_ENV, "").split(os.pathsep))):
        _import_once(f"{PLUGINS_ENV}:{entry}", lambda entry=entry: _import_plugin(entry))
    _import_once(ENTRY_POINT_GROUP, _load_entry_points)  # once a process: reading every package's metadata takes ms


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def _import_once(key: str, load) -> None:
    if key in _IMPORTED:
        return
    _IMPORTED.add(key)
    try:
        load()
    except BaseException:
        _IMPORTED.discard(key)  # the next lookup raises the same error rather than missing names
        raise


_SILENT_PLUGINS: list[str] = []
"""Entries of :data:`PLUGINS_ENV` whose import registered no strategy (a missing ``@register``?)."""


def _import_plugin(entry: str) -> None:
    """Import one entry of :data:`PLUGINS_ENV` (:func:`_load_plugin`), noting one that registers nothing."""
    before = set(_REGISTRY)
    _load_plugin(entry)
    if set(_REGISTRY) == before:
        _SILENT_PLUGINS.append(entry)


def _load_plugin(entry: str) -> None:
    """Import one entry of :data:`PLUGINS_ENV`: a ``.py`` file (as module ``rlcurate_strategies.<stem>``)
    or a module name; one line naming the entry when it is neither."""
    if entry.endswith(".py"):
        path = Path(entry).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"{PLUGINS_ENV}: {entry}: no such file")
        name = f"rlcurate_strategies.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: one line, with where in it
            sys.modules.pop(name, None)
            import traceback

            lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
            where = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else (lines[-1] if lines else None)
            raise UserError(f"{PLUGINS_ENV}: {entry}" + (f", line {where}" if where else "")
                            + f": importing it failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return
    try:
        found = importlib.util.find_spec(entry)
    except (ImportError, ValueError):  # a dotted name whose parent is missing; an empty segment
        found = None
    if found is None:
        raise UserError(f"{PLUGINS_ENV}: {entry!r} is neither a .py file nor an importable module")
    importlib.import_module(entry)


def available() -> list[str]:
    """The registered strategy names, sorted."""
    _discover()
    return sorted(_REGISTRY)


def close_matches(word: str, choices) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the choices closest to ``word``, else an empty string."""
    near = difflib.get_close_matches(str(word), list(choices), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""


def _unknown(name: str) -> UserError:
    silent = (f"; {PLUGINS_ENV} imported {', '.join(_SILENT_PLUGINS)}, which registered no strategy (is @register "
              f"missing above @dataclass?)" if _SILENT_PLUGINS else "")
    return UserError(f"unknown strategy {name!r}{close_matches(name, _REGISTRY)}; available: "
                     f"{', '.join(sorted(_REGISTRY))} (or a+b: the selector of a with the sampler of b; "
                     f"a strategy in a file of your own: {PLUGINS_ENV}=path/to/it.py){silent}")


def config_class(name: str) -> type[StrategyConfig]:
    """The configuration dataclass registered under ``name``; :class:`~rlcurate.errors.UserError`
    (with the closest names) when there is none."""
    _discover()
    if name not in _REGISTRY:
        raise _unknown(name)
    return _REGISTRY[name]


def options(name: str) -> dict[str, Any]:
    """The options of strategy ``name`` and their defaults: the strategy's own first, then those of
    the shared base it extends (each in the order they are declared)."""
    cls = config_class(name)
    mro = [k for k in cls.__mro__ if "__dataclass_fields__" in k.__dict__]

    def origin(field: str) -> int:  # the position in the mro of the most basic class declaring it
        return max(i for i, k in enumerate(mro) if field in k.__dict__.get("__annotations__", {}))

    fields = [f for f in dataclasses.fields(cls) if f.init]
    fields.sort(key=lambda f: origin(f.name))  # stable: declaration order within a class
    return {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory() for f in fields}


def _accepted(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(_REGISTRY[name]) if f.init}


def _check_kwargs(name: str, kwargs: dict, label: str) -> None:
    accepted = _accepted(name)
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
        accepted = _accepted(n)
        kw = {k: v for k, v in flat.items() if k in accepted}
        taken |= set(kw)
        takes |= accepted
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
    that are not a mapping, or keyword arguments that are not fields of the strategy's configuration.
    """
    _discover()
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(strategy, str) or not strategy.strip():
        raise UserError(f"strategy must be a name such as 'uniform' or 'insight+ada_seq_balanced', got {strategy!r}")
    if not isinstance(kwargs, dict):
        raise UserError(f"strategy_kwargs must be a mapping, got {kwargs!r}")
    names = [s.strip() for s in strategy.split("+")]
    for n in names:
        if n not in _REGISTRY:
            raise _unknown(n)
    if len(names) > 2:
        raise UserError(f"strategy {strategy!r}: compose at most two strategies (selector+sampler)")
    parts = _split_kwargs(names, kwargs)
    for n, kw in zip(names, parts):
        _check_kwargs(n, kw, "strategy_kwargs" if len(names) == 1 else f"strategy_kwargs for {n}")
    return list(zip(names, parts))


def _defaults(name: str) -> dict[str, Any]:
    """Each option of strategy ``name`` with its default (``dataclasses.MISSING`` for a factory-made one)."""
    return {f.name: f.default for f in dataclasses.fields(_REGISTRY[name]) if f.init}


def _check_numbers(name: str, kwargs: dict) -> None:
    """An option whose default is a number must be a finite number, and a whole one where the default is an
    int: a NaN or a string would otherwise reach the strategy's arithmetic at the first step."""
    import math
    import numbers

    defaults = _defaults(name)
    for key, value in kwargs.items():
        default = defaults.get(key)
        if isinstance(default, bool) or not isinstance(default, (int, float)) or value is None:
            continue
        whole = isinstance(default, int)
        ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
              and (not whole or float(value).is_integer()))
        if not ok:
            raise UserError(f"strategy {name!r}, strategy_kwargs {kwargs}: {key} must be "
                            f"{'a whole number' if whole else 'a finite number'}, got {value!r}")


def _typed(name: str, kwargs: dict) -> dict:
    """``kwargs`` with the types their defaults give, before the strategy sees them: an option whose default is a
    bool must be one (the string "false" is true to Python, so it switched the option on), and a whole float
    given for an int default (2.0) becomes an int (the strategy's arithmetic would take it as a float)."""
    import numpy as np

    defaults, out = _defaults(name), dict(kwargs)
    for key, value in kwargs.items():
        default = defaults.get(key)
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise UserError(f"strategy {name!r}, strategy_kwargs {kwargs}: {key} must be true or false, "
                                f"got {value!r}")
            out[key] = bool(value)
        elif isinstance(default, int) and isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    return out


def _build(name: str, kwargs: dict) -> Curator:
    kwargs = _typed(name, kwargs)
    try:
        curator = _REGISTRY[name](**kwargs).build()
    except UserError:
        raise
    except (ValueError, TypeError) as exc:  # a part rejecting a value (or its type) the user gave
        raise UserError(f"strategy {name!r}, strategy_kwargs {kwargs}: {exc}") from exc
    _check_numbers(name, kwargs)  # what the strategy's own checks let through
    return curator


def build_curator(strategy: str, **kwargs) -> Curator:
    """Build the curator named ``strategy`` (see :func:`available`). For ``a+b``, keyword arguments
    may be split as ``{a: {...}, b: {...}}`` or given flat (then each part takes the ones it knows).
    Bad names or arguments raise :class:`~rlcurate.errors.UserError` (:func:`validate_strategy`)."""
    named = validate_strategy(strategy, kwargs)
    parts = [_build(n, kw) for n, kw in named]
    if len(parts) == 1:
        return parts[0]
    _check_kept_options(named, kwargs)
    first, second = parts
    return Curator(first.selector, second.sampler, second.processors, name=strategy)


def _kept(curator: Curator, first: bool) -> list:
    """What ``a+b`` keeps of a part: the selector of ``a``, the sampler and processors of ``b``."""
    return [curator.selector] if first else [curator.sampler, *curator.processors]


def discarded_options(name: str, kwargs: dict, first: bool) -> list[str]:
    """The options in ``kwargs`` of strategy ``name`` that change nothing ``a+b`` keeps of it, ``name`` being ``a``
    (``first``) or ``b``: options of ``a``'s sampler or processors, of ``b``'s selector. Each option not at its
    default is left out of a second build; where the kept part comes out the same, it changed nothing kept (an
    option the build cannot do without counts as kept)."""
    defaults = _defaults(name)
    kept = _kept(_REGISTRY[name](**kwargs).build(), first)
    out = []
    for key, value in kwargs.items():
        if key in defaults and _same_parts(value, defaults[key]):
            continue
        try:
            without = _kept(_REGISTRY[name](**{k: v for k, v in kwargs.items() if k != key}).build(), first)
        except Exception:  # noqa: BLE001 (the others' values need it: it is used)
            continue
        if _same_parts(without, kept):
            out.append(key)
    return out


def _check_kept_options(named: list[tuple[str, dict]], kwargs: dict) -> None:
    """Refuse an option of ``a+b`` that changes only what the composition discards: it would be accepted and
    do nothing. A flat option both parts take is refused only when both discard it."""
    (a, _), (b, _) = named
    lost = [set(discarded_options(name, kw, first=k == 0)) for k, (name, kw) in enumerate(named)]
    for k, (name, kw) in enumerate(named):
        other = named[1 - k][1]
        for key in kw:
            shared_flat = name not in kwargs and key in other and (named[1 - k][0] not in kwargs)
            if key in lost[k] and (not shared_flat or key in lost[1 - k]):
                part, keeper = ("sampler and processors", b) if k == 0 else ("selector", a)
                raise UserError(f"strategy '{a}+{b}', strategy_kwargs {key}={kw[key]!r}: {key} changes only "
                                f"{name}'s {part}, which the composition takes from {keeper} instead ({a}+{b} keeps "
                                f"the selector of {a} and the sampler and processors of {b}); drop it, or run {name} "
                                f"alone")


def _same_parts(x: Any, y: Any, depth: int = 0) -> bool:
    """Structural equality of two built parts (their attributes, recursively); anything not comparable
    counts as different, so an option is refused only when it provably changes nothing kept."""
    import random

    import numpy as np

    if type(x) is not type(y):
        return False
    if isinstance(x, random.Random):
        return x.getstate() == y.getstate()
    if isinstance(x, np.random.Generator):
        return _same_parts(x.bit_generator.state, y.bit_generator.state, depth + 1)
    if isinstance(x, np.ndarray):
        return x.shape == y.shape and bool(np.array_equal(x, y))
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same_parts(u, v, depth + 1) for u, v in zip(x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same_parts(x[k], y[k], depth + 1) for k in x)
    if hasattr(x, "__dict__") and not callable(x) and depth < 8:
        return _same_parts(vars(x), vars(y), depth + 1)
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 (an object that cannot say: different)
        return False
