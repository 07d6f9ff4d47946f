"""What ``rlcurate runs`` says while it works (issue #33): a suite runs for hours on a CPU and days on a GPU.

One line each time a run starts, ends or fails, and, every ``every`` seconds, one line per running run
whose step or last held-out accuracy changed (read from its ``metrics.jsonl``). Every line begins with the
suite's state, ``[done D/N, running R, failed F, left L, ETA ...]``, the ETA from the mean wall time of
the runs finished so far; the same lines go to a log file a user can ``tail -f``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def last_state(metrics: Path) -> tuple[int | None, float | None]:
    """The last step of a run's ``metrics.jsonl`` and its last held-out accuracy (``None`` where there is
    none yet); a line being written is skipped."""
    step = accuracy = None
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step", step)
        accuracy = record.get("eval/accuracy", accuracy)
    return step, accuracy


class SuiteProgress:
    """The progress lines of one ``rlcurate runs`` call (module docstring). ``total`` runs to make, ``jobs``
    at a time; ``log`` the file the lines are also appended to; ``write`` where they are printed."""

    def __init__(self, total: int, jobs: int, log: Path | None = None, every: float = 60.0,
                 write: Callable[[str], None] = print):
        self.total, self.jobs, self.log, self.every, self.write = total, max(1, jobs), log, every, write
        self.done = self.failed = 0
        self.seconds: list[float] = []
        self.running: dict[tuple[str, int], tuple[Path, tuple]] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()

    def state(self) -> str:
        left = self.total - self.done - self.failed - len(self.running)
        eta = ""
        if self.seconds:
            mean = sum(self.seconds) / len(self.seconds)
            eta = f", ETA {_duration(mean * (left + len(self.running) / 2) / self.jobs)}"
        return (f"[done {self.done}/{self.total}, running {len(self.running)}, failed {self.failed}, "
                f"left {left}{eta}]")

    def _line(self, text: str) -> None:
        line = f"{self.state()} {text}"
        self.write(line)
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(line + "\n")

    def started(self, name: str, seed: int, run_dir: Path) -> None:
        with self.lock:
            self.running[(name, seed)] = (Path(run_dir), (None, None))
            self._line(f"started {name} seed {seed}")

    def finished(self, name: str, seed: int, seconds: float, accuracy) -> None:
        with self.lock:
            self.running.pop((name, seed), None)
            self.done += 1
            self.seconds.append(seconds)
            self._line(f"done {name} seed {seed} in {seconds:.0f} s, final accuracy {accuracy}")

    def failed_run(self, name: str, seed: int, error: str) -> None:
        with self.lock:
            self.running.pop((name, seed), None)
            self.failed += 1
            self._line(f"FAILED {name} seed {seed}: {error}")

    def stopped(self, name: str, seed: int) -> None:
        with self.lock:
            self.running.pop((name, seed), None)
            self._line(f"stopped {name} seed {seed} at a checkpoint")

    def poll(self) -> None:
        """One line per running run whose step or last held-out accuracy changed since the last poll."""
        with self.lock:
            for key, (run_dir, seen) in list(self.running.items()):
                now = last_state(run_dir / "metrics.jsonl")
                if now != seen and now[0] is not None:
                    self.running[key] = (run_dir, now)
                    acc = f", held-out accuracy {now[1]:.3f}" if now[1] is not None else ""
                    self._line(f"{key[0]} seed {key[1]} at step {now[0]}{acc}")

    def __enter__(self) -> "SuiteProgress":
        def loop():
            while not self._stop.wait(self.every):
                self.poll()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
