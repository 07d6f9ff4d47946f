"""Command-line options built from a configuration dataclass (issue #14: one configuration style).

A configuration is a dataclass whose fields are documented by the string right below each of them
(:func:`field_docs`). :class:`ConfigOptions` turns such a class into ``argparse`` options, so that
a command line re-declares neither the names, the defaults nor the help of its configuration:

- ``--field-name`` for every field, its help the field's docstring as plain text (a trailing
  ``(default: X)`` added by :class:`rlcurate._help.HelpFormatter`), its type from the annotation:
  ``int``, ``float`` and ``str`` as they are; ``bool`` as a flag (``--name`` when the default is
  False, ``--no-name`` when it is True); a tuple or list as one comma-separated value or as a
  repeated flag (:class:`Option` ``sep``); a ``dict`` as a JSON object; ``X | None`` defaults to None;
- :meth:`ConfigOptions.values` and :meth:`ConfigOptions.build` turn the parsed arguments back into
  field values and the dataclass; a value argparse cannot check (a JSON object, a list of numbers)
  raises :class:`~rlcurate.errors.UserError` naming the flag;
- :meth:`ConfigOptions.argv` is the inverse: the arguments that rebuild a configuration (for the
  command a checkpoint's README records), leaving out every flag whose value the others imply;
- :meth:`ConfigOptions.flag_message` writes ``runs must be ...`` (a validation error of the
  dataclass) as ``--runs must be ...``.

Options that are not configuration fields (``--out``, ``--quiet``, ...) stay explicit
``add_argument`` calls of the command.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rlcurate.errors import UserError

__all__ = ["ConfigOptions", "Option", "field_docs", "help_text"]


def field_docs(cls) -> dict[str, str]:
    """The docstring written under each field of the dataclass ``cls`` (and of its dataclass bases),
    whitespace folded: the ``--help`` of the command lines and the text of the docs."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # pragma: no cover (a class defined where there is no source)
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def help_text(doc: str) -> str:
    """A field's docstring as the help of an option: plain text, the first word in lower case unless
    it is a name (``AdamW``), no final full stop, ``%`` escaped for argparse."""
    from rlcurate._help import plain

    text = " ".join(plain(doc).split())
    first = text.split(" ", 1)[0]
    if re.fullmatch(r"(?:A|[A-Z][a-z]+)(?:-[a-z]+)*[,:;]?", first):
        text = text[0].lower() + text[1:]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text.replace("%", "%%")


@dataclass(frozen=True)
class Option:
    """How one field appears on a command line, where the defaults do not fit."""

    help: str | None = None
    """Replaces the docstring as the help (a negated flag, ``--no-shuffle``, says what it turns off)."""
    note: str | None = None
    """Appended to the docstring, for what only the command line needs saying."""
    choices: Sequence | None = None
    """The allowed values, checked by argparse."""
    metavar: str | None = None
    """The value's name in the usage (``JSON`` for a dict by default)."""
    sep: str | None = ","
    """A tuple or list field: one value split at ``sep``, or with ``sep=None`` a flag given once per
    element (``--stop A --stop B``, for values that may hold commas)."""


@dataclass(frozen=True)
class _Field:
    name: str
    flag: str
    kind: str  # "bool", "scalar", "seq", "dict"
    elem: Any  # int, float, str (the scalar or element type)
    optional: bool
    default: Any  # the field's default value; dataclasses.MISSING when it has none
    option: Option


def _resolve(annotation) -> tuple[str, Any, bool]:
    """``(kind, element type, optional)`` of a resolved annotation."""
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unsupported annotation {annotation!r}")
        annotation, optional = rest[0], True
    origin = typing.get_origin(annotation) or annotation
    if annotation is bool:
        return "bool", bool, optional
    if annotation in (int, float, str):
        return "scalar", annotation, optional
    if origin in (tuple, list):
        elems = [a for a in typing.get_args(annotation) if a is not Ellipsis] or [str]
        if len(set(elems)) != 1 or elems[0] not in (int, float, str):
            raise TypeError(f"unsupported sequence annotation {annotation!r}")
        return "seq", elems[0], optional
    if origin is dict:
        return "dict", dict, optional
    raise TypeError(f"unsupported annotation {annotation!r}")


def _format(value) -> str:
    """A value as the command line writes it: floats as short as they round-trip."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


class ConfigOptions:
    """The command-line options of the dataclass ``cls``: every field, or those in ``only``, less
    those in ``exclude``; ``options`` maps a field name to its :class:`Option`."""

    def __init__(self, cls, *, only: Iterable[str] | None = None, exclude: Iterable[str] = (),
                 options: dict[str, Option] | None = None):
        self.cls = cls
        options = dict(options or {})
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = (set(only or ()) | set(exclude) | set(options)) - set(names)
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        keep = set(names if only is None else only) - set(exclude)
        self.docs = field_docs(cls)
        self.fields: dict[str, _Field] = {}
        for f in dataclasses.fields(cls):
            if f.name not in keep:
                continue
            kind, elem, optional = _resolve(hints[f.name])
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = dataclasses.MISSING
            stem = f.name.replace("_", "-")
            flag = f"--no-{stem}" if kind == "bool" and default is True else f"--{stem}"
            self.fields[f.name] = _Field(f.name, flag, kind, elem, optional, default, options.get(f.name, Option()))

    # ------------------------------------------------------------------ parser
    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        """Add an option for every field to ``parser`` (or an argument group)."""
        for fd in self.fields.values():
            opt = fd.option
            text = opt.help if opt.help is not None else help_text(self.docs.get(fd.name, ""))
            if opt.note:
                text = f"{text}; {opt.note}" if text else opt.note
            default = None if fd.default is dataclasses.MISSING else fd.default
            kwargs: dict[str, Any] = {"dest": fd.name, "help": text}
            if fd.kind == "bool":
                kwargs.update(action="store_false" if fd.default is True else "store_true")
                parser.add_argument(fd.flag, **kwargs)
                continue
            if fd.kind == "scalar":
                kwargs.update(type=fd.elem, default=default)
            elif fd.kind == "seq" and opt.sep is None:
                kwargs.update(action="append", type=fd.elem, default=None)
                kwargs["help"] = f"{text} (repeatable)"
            elif fd.kind == "seq":
                kwargs.update(default=None if default is None else opt.sep.join(map(_format, default)))
                kwargs["help"] = f"{text} ({'comma' if opt.sep == ',' else repr(opt.sep)}-separated)"
            else:  # dict
                kwargs.update(default=None if default is None else json.dumps(default), metavar=opt.metavar or "JSON")
            if opt.choices is not None:
                kwargs["choices"] = list(opt.choices)
            if opt.metavar and "metavar" not in kwargs:
                kwargs["metavar"] = opt.metavar
            parser.add_argument(fd.flag, **kwargs)

    # ------------------------------------------------------------------ args -> configuration
    def values(self, args: argparse.Namespace) -> dict[str, Any]:
        """The field values of the parsed ``args``; :class:`~rlcurate.errors.UserError` names the
        flag of a value that is not what its field needs."""
        out = {}
        for fd in self.fields.values():
            raw = getattr(args, fd.name)
            if raw is None:  # left out (a required field: the dataclass or the command says so)
                out[fd.name] = None if fd.default is dataclasses.MISSING else fd.default
                continue
            out[fd.name] = self._convert(fd, raw)
        return out

    def build(self, args: argparse.Namespace, **overrides):
        """The dataclass built from the parsed ``args``, with ``overrides`` for fields the command
        sets itself."""
        return self.cls(**{**self.values(args), **overrides})

    def _convert(self, fd: _Field, raw):
        if fd.kind == "seq" and isinstance(raw, list):  # a repeated flag, already typed by argparse
            return tuple(raw)
        if fd.kind == "seq":
            parts = [s.strip() for s in str(raw).split(fd.option.sep) if s.strip()]
            try:
                return tuple(fd.elem(s) for s in parts)
            except ValueError:
                what = {int: "integers", float: "numbers"}.get(fd.elem, "values")
                raise UserError(f"{fd.flag} must be {'comma' if fd.option.sep == ',' else repr(fd.option.sep)}"
                                f"-separated {what}, got {raw!r}") from None
        if fd.kind == "dict" and isinstance(raw, str):
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise UserError(f"{fd.flag} is not valid JSON ({exc}): {raw!r}") from None
            if not isinstance(value, dict):
                raise UserError(f"{fd.flag} must be a JSON object, got {raw!r}")
            return value
        return raw

    # ------------------------------------------------------------------ configuration -> args
    def argv(self, config, *, names: Iterable[str] | None = None, always: Iterable[str] = ()) -> list[str]:
        """Command-line arguments that rebuild ``config`` (the inverse of :meth:`build`), in field
        order: a flag appears when it is in ``always`` or when leaving it out would change the
        field (its default, or a value the configuration derives from the others, is left out)."""
        always = set(always)
        out: list[str] = []
        for fd in self.fields.values():
            if names is not None and fd.name not in names:
                continue
            value = getattr(config, fd.name)
            if value is None or not (fd.name in always or self._needed(config, fd, value)):
                continue
            if fd.kind == "bool":
                if value != fd.default:
                    out.append(fd.flag)
            elif fd.kind == "seq" and fd.option.sep is None:
                for v in value:
                    out += [fd.flag, _format(v)]
            elif fd.kind == "seq":
                out += [fd.flag, fd.option.sep.join(map(_format, value))]
            elif fd.kind == "dict":
                out += [fd.flag, json.dumps(value)]
            else:
                out += [fd.flag, _format(value)]
        return out

    def _needed(self, config, fd: _Field, value) -> bool:
        if fd.default is dataclasses.MISSING:
            return True
        try:  # the configuration the other flags give, with this field at its default
            alt = dataclasses.replace(config, **{fd.name: fd.default})
        except (ValueError, TypeError):
            return True
        return getattr(alt, fd.name) != value

    # ------------------------------------------------------------------ messages
    def flag_message(self, message: str) -> str:
        """``NAME must ...`` -> ``--name must ...`` where ``NAME`` is a field on the command line
        (the validation errors of a configuration name the field, the user typed the flag)."""
        name, _, rest = str(message).partition(" ")
        fd = self.fields.get(name)
        if fd is None or not rest.startswith("must"):
            return str(message)
        return f"--{name.replace('_', '-')} {rest}" if fd.kind == "bool" else f"{fd.flag} {rest}"
