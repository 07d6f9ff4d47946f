"""Plain-text help for the command line (:mod:`rlcurate.cli`).

Docstrings are reStructuredText, written for the API documentation; a terminal wants plain text.
Every sub-command builds its ``--help`` from :func:`plain` text with :class:`HelpFormatter`.
"""

from __future__ import annotations

import argparse
import re
import textwrap

__all__ = ["ArgumentParser", "HelpFormatter", "plain", "wrap"]

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_DEFAULT_ROLE = re.compile(r"(?<![`\w])`([^`\n]+)`(?![`\w])")
_STRONG = re.compile(r"(?<![\w*])\*\*(\S(?:[^*\n]*\S)?)\*\*(?![\w*])")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:[^*\n]*\S)?)\*(?![\w*])")


def _role_target(match: re.Match) -> str:
    target = match.group(1).strip()
    explicit = re.match(r"(.*?)\s*<[^>]+>$", target)  # :ref:`the text <label>`
    if explicit:
        return explicit.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: ````x```` becomes ``x``, ``:class:`~a.B``` becomes
    ``B``, ``:mod:`a.b``` becomes ``a.b``, ``*emphasis*`` and ``**strong**`` lose their stars, and a
    literal-block marker ``::`` at the end of a line becomes ``:``."""
    text = _ROLE.sub(_role_target, text)
    text = _LITERAL.sub(r"\1", text)
    text = _DEFAULT_ROLE.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = re.sub(r"\s*::$", ":", text, flags=re.M)
    return text


def wrap(text: str, width: int = 100, indent: str = "") -> str:
    """:func:`plain` ``text`` as one paragraph wrapped to ``width`` columns, every line indented."""
    return textwrap.fill(" ".join(plain(text).split()), width=width, initial_indent=indent,
                         subsequent_indent=indent)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of a description and an epilog (usage examples) and appends
    ``(default: X)`` to an option's help, unless the help already names its default or there is
    none to show (``None``, ``False``, an empty list, a flag that takes no value)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or default == [] or action.nargs == 0
                or default == "" or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``PROG: error: MESSAGE; see 'PROG --help'``, with
    exit status 2 (the convention of :mod:`rlcurate.errors`) instead of the usage and the error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--seed 3` is not `--seeds 3`: a prefix is refused, not completed
        super().__init__(*args, **kwargs)

    def error(self, message):
        from rlcurate.errors import one_line

        self.exit(2, f"{self.prog}: error: {one_line(message)}; see '{self.prog} --help'\n")
