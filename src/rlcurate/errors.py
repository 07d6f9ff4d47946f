"""The one exception type for a user's mistake.

A :class:`UserError` is bad input that the user can fix: a misspelt strategy, a missing model folder,
a malformed data file, a configuration that does not match the run it would resume. The command line
(:mod:`rlcurate.cli`) prints its message as one line, ``rlcurate <command>: error: <message>``, and
exits with status 2, without a traceback. Everything else is a bug and keeps its traceback.

Raise it (or a subclass) at the boundary where the input is read, before any expensive work starts,
with a message that names the input and says what is wrong with it.
"""

from __future__ import annotations

__all__ = ["Stopped", "UserError", "one_line", "write_failure"]


class UserError(ValueError):
    """Bad input the user can fix; the message names the input and what is wrong with it."""


class Stopped(Exception):
    """A command stopped on a signal (SIGTERM, SIGINT) after saving its work; the message says where and
    how to go on. The command line prints ``rlcurate <command>: stopped: <message>`` and exits with
    ``exit_code`` (128 + the signal's number, as a shell reports a process killed by it)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = int(exit_code)


def one_line(message: object) -> str:
    """``message`` on one line (newlines folded to ``; ``), for the ``error:`` line of the CLI."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def write_failure(exc: BaseException) -> str | None:
    """Why a write failed, when ``exc`` is a failed write as the savers report it, else None: an ``OSError``
    (its ``strerror``); torch.save's zip writer (``inline_container.cc``), which raises a ``RuntimeError`` saying
    "file write failed" or, on a full disk, "unexpected pos N vs M" (seen in CI); safetensors' ``SafetensorError``
    ("I/O error: No space left on device"), which ``save_pretrained`` raises."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError):
        return exc.strerror or text
    if isinstance(exc, RuntimeError) and any(s in text for s in ("write", "inline_container")):
        return text
    if type(exc).__name__ == "SafetensorError" and "I/O error" in text:
        return text
    return None
