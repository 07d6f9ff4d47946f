"""The files of an audit folder (chapter 4, *The variance audit*): reading them back, appending to
them so that no interruption loses a finished batch, and the lock that keeps two audits out of one
folder.

``runs.jsonl`` gets one JSON line per (sample, run), appended batch by batch with a single ``write``
and an ``fsync`` (:func:`_append_lines`); a truncated last line, left by an interrupted write, is
ignored when read (:func:`read_runs`) and cut off before the next append (:func:`_repair_tail`).
``config.json`` is replaced atomically (:func:`_write_json_atomic`); ``prompts.jsonl`` holds each
sample's question and answer; ``sessions.jsonl`` one line per invocation. ``SIGTERM`` waits for the
write under way (:class:`_Terminate`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from rlcurate.audit.config import AuditError, AuditStopped, AuditTerminated

log = logging.getLogger(__name__)

__all__ = ["CONFIG_FILE", "FORMAT", "PROMPTS_FILE", "RUNS_FILE", "SESSIONS_FILE", "read_config", "read_runs"]

FORMAT = "rlcurate-audit/1"
RUNS_FILE = "runs.jsonl"
CONFIG_FILE = "config.json"
SESSIONS_FILE = "sessions.jsonl"
PROMPTS_FILE = "prompts.jsonl"


def read_config(out_dir) -> dict:
    """The parsed ``config.json`` of an audit folder; :class:`AuditError` when missing or malformed."""
    path = Path(out_dir) / CONFIG_FILE
    if not path.is_file():
        raise AuditError(f"{path} does not exist: {str(out_dir)!r} is not an audit folder")
    try:
        info = json.loads(path.read_text())
    except ValueError as exc:
        raise AuditError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or "config" not in info or "samples" not in info:
        raise AuditError(f"{path} is not an rlcurate audit config (format {FORMAT!r})")
    config, samples, n_samples = info["config"], info["samples"], info.get("n_samples", 0)
    for ok, field, want, got in (
            (isinstance(config, dict), "config", "a mapping", config),
            (isinstance(config, dict) and _whole(config.get("runs"), 1), "config.runs", "a whole number >= 1",
             isinstance(config, dict) and config.get("runs")),
            (isinstance(samples, list) and all(isinstance(u, str) for u in samples), "samples", "a list of uids",
             samples if not isinstance(samples, list) else "a list with a non-string uid"),
            (_whole(n_samples, 0), "n_samples", "a whole number", n_samples)):
        if not ok:
            raise AuditError(f"{path}: {field} must be {want}, got {got!r}; the file was edited or corrupted")
    return info


def _whole(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


_RUN_FIELDS = {"index": int, "uid": str, "run": int, "score": float, "reason": str, "completion": str,
               "n_tokens": int, "finish_reason": str}
_TEXT_FIELDS = ("reason", "completion")
"""Fields a slimmed audit may leave out (the committed GSM8K audit keeps scores only); read as ""."""


def read_runs(path) -> tuple[list[dict], int]:
    """The complete records of a ``runs.jsonl`` file and the byte length of its valid part.

    Lines are complete only when they end with a newline; an unterminated last line (an interrupted
    write) is ignored, and the returned length stops before it. A malformed *complete* line raises
    :class:`AuditError` naming the file and line. A (sample, run) pair recorded twice keeps its
    first record.
    """
    path = Path(path)
    if not path.exists():
        return [], 0
    raw = path.read_bytes()
    end = raw.rfind(b"\n") + 1  # 0 when there is no complete line
    records, seen = [], set()
    for lineno, line in enumerate(raw[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise AuditError(f"{path}, line {lineno}: not valid JSON ({exc}); the file was edited or "
                             "corrupted: move it away to start the audit afresh") from None
        if not isinstance(rec, dict):
            raise AuditError(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
        for name in _TEXT_FIELDS:
            rec.setdefault(name, "")
        for name, kind in _RUN_FIELDS.items():
            v = rec.get(name)
            ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) if kind is float
                  else isinstance(v, kind))
            if kind is int and isinstance(v, bool):
                ok = False
            if not ok:
                want = "a finite number" if kind is float else kind.__name__
                raise AuditError(f"{path}, line {lineno}: field {name!r} must be {want}, got {v!r}")
        key = (rec["index"], rec["run"])
        if key in seen:
            continue
        seen.add(key)
        records.append(rec)
    return records, end


def _repair_tail(path: Path, valid_bytes: int) -> int:
    """Cut an unterminated last line off ``path``; returns the number of bytes removed."""
    size = path.stat().st_size if path.exists() else 0
    if size > valid_bytes:
        with open(path, "r+b") as f:
            f.truncate(valid_bytes)
            f.flush()
            os.fsync(f.fileno())
        log.warning("%s: removed a truncated last line (%d bytes) left by an interrupted write",
                    path, size - valid_bytes)
        return size - valid_bytes
    return 0


def _write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    if not lines:
        return
    data = "".join(lines).encode()
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _append_session(out: Path, session: dict) -> None:
    _append_lines(out / SESSIONS_FILE, [json.dumps(session) + "\n"])


def _write_prompts(out: Path, problems, uids: list[str]) -> None:
    """``prompts.jsonl``: each sample's uid, question and reference answer in audit order (what the
    summary's ``mixed.jsonl`` carries); kept when it already covers at least as many samples."""
    path = out / PROMPTS_FILE
    if path.exists():
        try:
            if path.read_bytes().count(b"\n") >= len(uids):
                return
        except OSError:
            pass
    text = "".join(json.dumps({"index": i, "uid": uids[i], "question": p.question, "answer": p.answer},
                              ensure_ascii=False) + "\n" for i, p in enumerate(problems))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _stopped_by_write(path: Path, exc: OSError, saved: int, runs_path: Path) -> AuditStopped:
    return AuditStopped(f"cannot write {path} ({_why(exc)}); the {saved} runs finished before it are saved in "
                        f"{runs_path}; free some space or make the folder writable, then run the same command "
                        "again to resume")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _check_writable(out: Path) -> None:
    """Create ``out`` and check that files can be created in it and the audit's files appended to,
    before any model is loaded; :class:`AuditError` ``cannot write to ...`` otherwise."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-check-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"ok\n")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
        for name in (RUNS_FILE, SESSIONS_FILE, CONFIG_FILE, PROMPTS_FILE):
            if (out / name).exists():
                open(out / name, "ab").close()
    except OSError as exc:
        where = exc.filename if exc.filename and Path(exc.filename).name in (
            RUNS_FILE, SESSIONS_FILE, CONFIG_FILE, PROMPTS_FILE) else out
        raise AuditError(f"cannot write to {where} ({_why(exc)}); choose a writable --out folder") from None


def _lock_folder(out: Path):
    """An exclusive ``flock`` on ``out/.lock``: two audits must not append to one folder at once."""
    try:
        f = open(out / ".lock", "a")
    except OSError as exc:
        raise AuditError(f"cannot write to {out} ({_why(exc)}); choose a writable --out folder") from None
    try:
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # pragma: no cover (not POSIX): no protection
        pass
    except OSError:
        f.close()
        raise AuditError(f"another audit is running in {out} (it holds {out / '.lock'}); wait for it or use "
                         "another --out folder") from None
    return f


class _Terminate:
    """Turns ``SIGTERM`` into :class:`AuditTerminated`, raised at once unless a write is under way,
    in which case it is raised when the write is done (no half-written batch, no lost session)."""

    def __init__(self):
        self.writing = 0
        self.pending: int | None = None

    def handler(self, signum, frame):
        if self.writing:
            self.pending = signum
            return
        raise AuditTerminated(signum)

    @contextmanager
    def write(self):
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
        if self.pending is not None and not self.writing:
            signum, self.pending = self.pending, None
            raise AuditTerminated(signum)

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread
            return
        previous = signal.signal(signal.SIGTERM, self.handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)
