"""How long the README's two set-up commands take on a fresh clone, as CI runs them (README, *Two commands*).

Clones this repository's HEAD into a temporary folder with ``../shared`` beside it, points the SmolLM2 cache and uv's
download cache at empty folders (a fresh CI machine has neither) and sets ``RLCURATE_REQUIRE_BROWSER=1`` (CI fails without the browser
check), then times ``make setup`` and ``make test`` there. Records the seconds of each, the suite's counts, its 40
slowest tests and the machine with its load average before and after: a timing means something only on a machine
that ran nothing else meanwhile, which the load average shows. About 22 minutes on a 2-core AMD EPYC.

    .venv/bin/python bench/time_make_test.py                      # writes data/bench/make_test.json
    .venv/bin/python bench/time_make_test.py --log run.log --setup-seconds 209 --total-seconds 1177 --commit SHA
                                                                  # a run made by hand: its log, times and commit
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, write_json  # noqa: E402

SUMMARY = re.compile(r"=+ (?:(\d+) failed, )?(\d+) passed(?:, (\d+) skipped)?.* in ([\d.]+)s")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def parse(log: str) -> dict:
    """The counts, pytest's own seconds and the slowest tests from a ``make test`` log."""
    found = SUMMARY.findall(log)
    if not found:
        raise SystemExit("the log holds no pytest summary line (did make test run?)")
    failed, passed, skipped, seconds = found[-1]
    slowest = [{"seconds": float(s), "phase": phase, "test": test}
               for s, phase, test in (m.groups() for m in map(DURATION.match, log.splitlines()) if m)]
    return {"passed": int(passed), "skipped": int(skipped or 0), "failed": int(failed or 0),
            "pytest_seconds": float(seconds), "slowest": slowest}


def run_fresh_clone(log_path: Path) -> tuple[float, float]:
    """Clone, ``make setup``, ``make test``; the output goes to ``log_path``. Returns (set-up seconds, total)."""
    with tempfile.TemporaryDirectory(prefix="rlcurate_fresh_clone_") as tmp:
        clone, cache, uv_cache = Path(tmp) / "main", Path(tmp) / "cache", Path(tmp) / "uv-cache"
        cache.mkdir()
        uv_cache.mkdir()
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        (Path(tmp) / "shared").symlink_to(REPO.parent / "shared")
        env = {**os.environ, "RLCURATE_CACHE_DIR": str(cache), "UV_CACHE_DIR": str(uv_cache),
               "RLCURATE_REQUIRE_BROWSER": "1"}
        env.pop("VIRTUAL_ENV", None)
        with open(log_path, "w") as log:
            t0 = time.perf_counter()
            subprocess.run(["make", "setup"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
            t_setup = time.perf_counter() - t0
            subprocess.run(["make", "test", "PYTEST_ARGS=--durations=40"], cwd=clone, env=env, stdout=log,
                           stderr=subprocess.STDOUT)
            return t_setup, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DATA / "make_test.json"))
    ap.add_argument("--log", type=Path, help="read this log of a run made by hand instead of running one")
    ap.add_argument("--setup-seconds", type=float, help="with --log: the run's set-up seconds")
    ap.add_argument("--total-seconds", type=float, help="with --log: the run's seconds, set-up included")
    ap.add_argument("--commit", help="with --log: the commit the run tested (default: HEAD)")
    args = ap.parse_args(argv)
    if args.log and (args.setup_seconds is None or args.total_seconds is None):
        ap.error("--log needs --setup-seconds and --total-seconds")
    load_before = [round(x, 2) for x in os.getloadavg()]
    if args.log:
        log_path, t_setup, t_total, how = args.log, args.setup_seconds, args.total_seconds, "a run made by hand"
    else:
        log_path = Path(tempfile.mkdtemp(prefix="rlcurate_make_test_")) / "make_test.log"
        t_setup, t_total = run_fresh_clone(log_path)
        how = "bench/time_make_test.py"
    result = {**header("make setup and make test on a fresh clone, empty SmolLM2 and uv caches, the browser check "
                       "required (as CI runs them)"),
              "how": how, "tested_commit": args.commit if args.log and args.commit else None,
              "setup_seconds": round(t_setup, 1), "test_seconds": round(t_total - t_setup, 1),
              "total_seconds": round(t_total, 1), **parse(log_path.read_text(errors="replace"))}
    if not args.log:
        result["machine"]["load_avg_before_run"] = load_before
    if result["tested_commit"] is None:
        result["tested_commit"] = result["git_sha"]
    write_json(result, args.out)
    print(f"set-up {t_setup:.0f} s, tests {t_total - t_setup:.0f} s, in all {t_total:.0f} s: {result['passed']} passed, "
          f"{result['skipped']} skipped, {result['failed']} failed; written to {args.out}")
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
