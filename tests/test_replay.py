"""The numbers do not move (issue #14): the first steps of committed reference runs, re-run with the
code as it is now, give the stored metrics.

The stored runs were made by earlier versions of the code, some on other processors, so float
metrics are compared to a relative 1e-5 (what float rounding of a changed summation order does over a
few steps of the tiny model) and counts exactly. On one machine the refactor of issue #14 replays them
bit for bit against the code before it: ``rlcurate runs --suite configs/suites/NAME.yaml --replay 20``
prints every differing value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcurate.book.records import compare_records
from rlcurate.experiments import replay_prefix

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "data" / "runs"
# one seed of every distinct run of every suite
SEED0 = sorted(p for p in RUNS.glob("*/*_s0.json"))
STEPS = 3


@pytest.mark.slow
@pytest.mark.parametrize("path", SEED0, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_stored_run_prefix_replays(path, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # configs name the model folder relative to the repository
    result = json.loads(path.read_text())
    diffs = replay_prefix(result, STEPS, tmp_path)
    assert all(step <= STEPS for step, *_ in diffs)
    stored = {r["step"]: r for r in result["metrics"] if r["step"] <= STEPS}
    changed = {(step, key): now for step, key, _, now in diffs}
    for step, rec in stored.items():
        old = {k: v for k, v in rec.items() if not k.startswith(("time/", "eval/"))}
        new = {k: changed.get((step, k), v) for k, v in old.items()}
        problems = compare_records(old, new, rtol=1e-5, atol=1e-9)
        assert not problems, f"{path.name} step {step}: {problems}"


def test_replay_reports_a_moved_number(tmp_path, monkeypatch):
    """The comparison can fail: a stored value changed by hand is reported."""
    monkeypatch.chdir(REPO)
    result = json.loads((RUNS / "end_to_end" / "uniform_s0.json").read_text())
    result["metrics"][1]["rollouts"] += 1
    diffs = replay_prefix(result, 1, tmp_path)
    assert any(step == 1 and key == "rollouts" for step, key, *_ in diffs)
