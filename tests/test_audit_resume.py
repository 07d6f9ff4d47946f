"""The SIGKILL resume test of the variance audit (chapter 4).

``python -m rlcurate.audit.cli`` audits 60 arithmetic prompts x 4 runs in a subprocess. Once
``runs.jsonl`` holds some but not all of its 240 lines the process is killed with SIGKILL, half a
line is appended (as if the kill had hit a write), and the same command is run again to completion.
Its ``runs.jsonl`` (as a set of lines) and its ``summary.json`` (without wall times) must equal those
of an uninterrupted audit with the same seed.

The model is the ``spread`` tiny checkpoint when ``data/tiny/spread`` exists (its scores are mixed,
so the summary is not trivial); otherwise a seeded random tiny model, whose completions are still
compared line by line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcurate.audit.runner import RUNS_FILE, SESSIONS_FILE

REPO = Path(__file__).resolve().parents[1]
SPREAD = REPO / "data" / "tiny" / "spread"
N_PROMPTS, N_RUNS = 60, 4
TOTAL = N_PROMPTS * N_RUNS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, int]:
    """(checkpoint directory, max_new_tokens)."""
    if (SPREAD / "config.json").is_file():
        return str(SPREAD), 48
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    path = tmp_path_factory.mktemp("tiny-random")
    save_tiny(build_tiny_model(dict(initializer_range=0.1), seed=0), build_tiny_tokenizer(), path)
    return str(path), 12


def command(ckpt: str, max_new: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "rlcurate.audit.cli", "--model", ckpt, "--task", "arithmetic",
            "--split", "test", "--runs", str(N_RUNS), "--limit", str(N_PROMPTS), "--max-new-tokens", str(max_new),
            "--seed", "11", "--chunk-size", "6", "--threads", "1", "--quiet", "--no-plots", "--out", str(out)]


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def env():
    e = dict(os.environ)
    e.setdefault("HF_HUB_OFFLINE", "1")
    return e


def without_timing(path: Path) -> dict:
    s = json.loads(path.read_text())
    s.pop("timing")
    return s


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_audit(checkpoint, tmp_path):
    ckpt, max_new = checkpoint
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    runs = killed / RUNS_FILE

    proc = subprocess.Popen(command(ckpt, max_new, killed), env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    try:
        while count_lines(runs) < 2 * 6 * N_RUNS:  # at least two chunks on disk
            if proc.poll() is not None:
                pytest.fail(f"the audit ended before it could be killed: rc={proc.returncode} "
                            f"{proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the audit wrote too little in 300 s")
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = count_lines(runs)
    assert 0 < done < TOTAL, done
    assert not (killed / SESSIONS_FILE).exists()  # the killed session had no chance to log itself
    with open(runs, "ab") as f:  # as if the kill had landed in the middle of a write
        f.write(b'{"index": 59, "uid": "add:1+')

    resumed = subprocess.run(command(ckpt, max_new, killed), env=env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "removed a truncated last line" in resumed.stderr
    session = json.loads((killed / SESSIONS_FILE).read_text().splitlines()[-1])
    assert session["runs_before"] == done and session["new_runs"] == TOTAL - done
    assert session["resume_mismatches"] == 0

    fresh = subprocess.run(command(ckpt, max_new, clean), env=env(), capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]

    a, b = (sorted((d / RUNS_FILE).read_text().splitlines()) for d in (killed, clean))
    assert len(a) == TOTAL and a == b
    assert without_timing(killed / "summary.json") == without_timing(clean / "summary.json")
    print(f"killed after {done}/{TOTAL} lines; resumed audit equals the uninterrupted one")
