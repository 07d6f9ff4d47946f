"""Record the replay fixtures of the committed reference runs (issue #26; see ``rlcurate.replay``).

For every committed seed-0 run (or the runs named), sample its first steps while recording the
rollouts, check them against the committed metrics, replay them teacher-forced and write
``tests/replays/<suite>/<run>_s0.json.gz``. A run whose sampled steps are not the committed run's on
this machine (a token flipped at a near-tie) is recorded with fewer steps, and said so.

    .venv/bin/python scripts/record_replays.py                       # every run that has no fixture yet
    .venv/bin/python scripts/record_replays.py data/runs/protocol/uniform_s0.json --force

Steps: 3 for the tiny model (seconds), :data:`SMOLLM2_STEPS` for SmolLM2, whose step is dominated by
training a 135M model on one CPU thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "replays"
TINY_STEPS = 3
SMOLLM2_STEPS = 2
# SmolLM2 runs whose first steps take a code path no other SmolLM2 fixture takes (the model, the chat
# format and the shared prompt prefix are common to all of them): uniform selection and the optimizer's
# update, INSIGHT's selection with SAGE-LIGHT's user-turn hints, and hinted failures counted as evidence.
# Dynamic sampling's extra rounds and Ada-Seq's rounds at G = 4 are the same code on every model; the tiny
# model's fixtures replay them (protocol/dapo, protocol/ada_seq_n4), at a fraction of a SmolLM2 replay's
# 45 s (tests/test_replay.py's COVERED_BY_OTHERS).
SMOLLM2_RUNS = ("smollm2_protocol/uniform", "smollm2_protocol/combined", "smollm2_revisit/combined_failures")


def default_runs() -> list[Path]:
    runs = []
    for path in sorted((REPO / "data" / "runs").glob("*/*_s0.json")):
        model = json.loads(path.read_text())["config"]["model"]
        if model != "smollm2" or f"{path.parent.name}/{path.stem[:-3]}" in SMOLLM2_RUNS:
            runs.append(path)
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, help="committed run JSONs (default: every seed-0 run)")
    ap.add_argument("--force", action="store_true", help="record again where a fixture exists")
    ap.add_argument("--out", type=Path, default=FIXTURES)
    args = ap.parse_args(argv)

    import os

    os.chdir(REPO)  # configs name the model folder relative to the repository
    from rlcurate.errors import UserError
    from rlcurate.replay import fixture_path, record_fixture, save_fixture

    for path in args.runs or default_runs():
        result = json.loads(path.read_text())
        target = fixture_path(args.out, result["suite"], result["run"], result["seed"])
        if target.exists() and not args.force:
            continue
        steps = SMOLLM2_STEPS if result["config"]["model"] == "smollm2" else TINY_STEPS
        start = time.perf_counter()
        while True:
            try:
                with tempfile.TemporaryDirectory() as scratch:
                    fixture = record_fixture(result, steps, scratch)
                break
            except UserError as exc:
                if steps == 1:
                    print(f"{path}: not recorded: {exc}", flush=True)
                    fixture = None
                    break
                print(f"{path}: {exc}; recording {steps - 1} step(s)", flush=True)
                steps -= 1
        if fixture is None:
            continue
        save_fixture(fixture, target)
        check = fixture["sampler"]
        print(f"{target.relative_to(REPO)}: {steps} step(s), {check['tokens']} tokens, "
              f"{len(check['near_ties'])} near-tie(s), {target.stat().st_size / 1024:.0f} KiB, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
