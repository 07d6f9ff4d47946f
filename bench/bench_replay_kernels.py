"""How far the replayed numbers move across CPU kernel paths (issue #26): what the replay tolerances
of ``rlcurate.replay.TOLERANCES`` are set from. Not a speed comparison.

Every replay fixture (``tests/replays``) is replayed teacher-forced in a fresh process per kernel
setting: this machine's own kernels with the runs' one thread and with two, torch's ATen kernels held
to AVX2 and to the portable default, and MKL and oneDNN held to AVX2 as well (the nearest this machine
comes to another vendor's processor). For each setting and metric the largest relative difference to
the fixture's reference (its teacher-forced replay on the recording machine) is kept, with the
sampler's near-ties and their distances. The committed runs were sampled on AMD EPYC machines; their
metrics against the fixtures' sampled steps on this machine are a real cross-processor difference and
are reported beside them.

    .venv/bin/python bench/bench_replay_kernels.py          # about 10 minutes on the 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, write_json  # noqa: E402

AVX2_LIBS = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SETTINGS = {
    "own_1thread": ({}, None),
    "own_2threads": ({}, 2),
    "aten_avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, 2),
    "aten_default": ({"ATEN_CPU_CAPABILITY": "default"}, 2),
    "all_avx2": ({"ATEN_CPU_CAPABILITY": "avx2", **AVX2_LIBS}, 2),
    "all_avx2_1thread": ({"ATEN_CPU_CAPABILITY": "avx2", **AVX2_LIBS}, None),
}


def worker(threads: int | None) -> None:
    """Replay every fixture; one JSON line per fixture on stdout."""
    import torch

    from rlcurate.provenance import kernel_signature
    from rlcurate.replay import forced_replay, load_fixture, relative_differences

    os.chdir(REPO)
    for path in sorted((REPO / "tests" / "replays").glob("*/*.json.gz")):
        fixture = load_fixture(path)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            metrics, check = forced_replay(fixture, scratch, threads=threads)
        counts_equal = all(old.get(k) == new.get(k) for old, new in zip(fixture["forced"], metrics)
                           for k in old if isinstance(old[k], int) and not isinstance(old[k], bool))
        print(json.dumps({"fixture": f"{path.parent.name}/{path.name.removesuffix('.json.gz')}",
                          "capability": torch.backends.cpu.get_cpu_capability(), "kernels": kernel_signature(),
                          "relative": relative_differences(fixture["forced"], metrics), "counts_equal": counts_equal,
                          "tokens": check.tokens, "near_ties": check.near_ties, "mismatches": check.mismatches,
                          "seconds": time.perf_counter() - t0}), flush=True)


def cross_processor() -> dict:
    """The committed runs (sampled on the machines named in their environment) against the fixtures'
    sampled steps on this machine."""
    from rlcurate.replay import load_fixture, relative_differences

    out = {}
    for path in sorted((REPO / "tests" / "replays").glob("*/*.json.gz")):
        fx = load_fixture(path)
        run = json.loads((REPO / "data" / "runs" / fx["suite"] / f"{fx['run']}_s{fx['seed']}.json").read_text())
        stored = [r for r in run["metrics"] if 1 <= r["step"] <= fx["steps"]]
        out[f"{fx['suite']}/{fx['run']}_s{fx['seed']}"] = {
            "recorded_on": run.get("environment", {}).get("cpu"), "replayed_on": fx["recorded_on"]["cpu"],
            "relative": relative_differences(stored, fx["sampled"])}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only", nargs="+", choices=sorted(SETTINGS), default=None)
    ap.add_argument("--out", default=str(DATA / "replay_kernels.json"))
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.threads)
        return 0
    result = {**header("teacher-forced replays of every fixture under several CPU kernel paths"), "settings": {}}
    for name in args.only or SETTINGS:
        env_over, threads = SETTINGS[name]
        cmd = [sys.executable, __file__, "--worker"] + (["--threads", str(threads)] if threads else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, **env_over}, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{name}: the worker failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        worst: dict[str, float] = {}
        for row in rows:
            for k, v in row["relative"].items():
                worst[k] = max(worst.get(k, 0.0), v)
        result["settings"][name] = {
            "env": env_over, "threads": threads or "the runs' own (1)", "capability": rows[0]["capability"],
            "worst_relative": worst, "counts_equal": all(r["counts_equal"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows), "near_ties": [[r["fixture"], *t] for r in rows for t in r["near_ties"]],
            "mismatches": [[r["fixture"], *t] for r in rows for t in r["mismatches"]],
            "seconds": time.perf_counter() - t0, "per_fixture": rows}
        print(f"{name}: capability {rows[0]['capability']}, worst relative "
              f"{max(worst.values()) if worst else 0:.2e} ({max(worst, key=worst.get) if worst else '-'}), "
              f"{len(result['settings'][name]['near_ties'])} near-tie(s), "
              f"{len(result['settings'][name]['mismatches'])} mismatch(es), {time.perf_counter() - t0:.0f} s", flush=True)
    result["cross_processor"] = cross_processor()
    worst_cross: dict[str, float] = {}
    for v in result["cross_processor"].values():
        for k, d in v["relative"].items():
            worst_cross[k] = max(worst_cross.get(k, 0.0), d)
    result["cross_processor_worst"] = worst_cross
    print("committed runs (AMD EPYC) vs this machine's sampled steps, worst relative:",
          {k: f"{v:.1e}" for k, v in sorted(worst_cross.items()) if v}, flush=True)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
