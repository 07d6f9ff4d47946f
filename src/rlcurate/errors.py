"""The one exception type for a user's mistake.

A :class:`UserError` is bad input that the user can fix: a misspelt strategy, a missing model folder,
a malformed data file, a configuration that does not match the run it would resume. The command line
(:mod:`rlcurate.cli`) prints its message as one line, ``rlcurate <command>: error: <message>``, and
exits with status 2, without a traceback. Everything else is a bug and keeps its traceback.

Raise it (or a subclass) at the boundary where the input is read, before any expensive work starts,
with a message that names the input and says what is wrong with it.
"""

from __future__ import annotations

__all__ = ["UserError", "one_line"]


class UserError(ValueError):
    """Bad input the user can fix; the message names the input and what is wrong with it."""


def one_line(message: object) -> str:
    """``message`` on one line (newlines folded to ``; ``), for the ``error:`` line of the CLI."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
