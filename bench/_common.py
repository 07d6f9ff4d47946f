"""Helpers shared by the side-by-side benchmarks in ``bench/`` (appendix A1, *Benchmarks*).

Every benchmark measures the things it compares in one process, interleaved (A, B, A, B, ...), after
a warm-up, and reports medians of the repeats and the ratio of the medians; a shared, loaded machine
slows both sides alike. Results are JSON with the versions, the machine, the date, the git SHA and
the load average before and after.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from rlcurate.provenance import package_versions, provenance

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "bench"


def machine(threads: int | None = None, env: dict | None = None) -> dict:
    """The machine part of a result file, from the :func:`rlcurate.provenance.provenance` record ``env``."""
    import torch

    env = provenance(device="cuda" if torch.cuda.is_available() else "cpu") if env is None else env
    info = {"cpu": env["cpu"], "cores": env["cores"], "platform": env["platform"],
            "torch_threads": threads if threads is not None else env["threads"],
            "load_avg": [round(x, 2) for x in os.getloadavg()]}
    if env["gpu"]:
        info["gpu"] = env["gpu"]
    return info


def header(what: str, threads: int | None = None, extra_versions: Sequence[str] = ()) -> dict:
    """The common part of every result file: the date, the git commit, versions and the machine, and
    the whole :func:`rlcurate.provenance.provenance` record as ``environment``."""
    import torch

    env = provenance(device="cuda" if torch.cuda.is_available() else "cpu", extra_packages=extra_versions)
    return {"what": what,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": env["git_sha"], "git_dirty": env["git_dirty"],
            "versions": package_versions(extra_versions), "machine": machine(threads, env), "environment": env}


def interleaved(fns: Sequence[Callable[[], object]], repeats: int, warmup: int = 1) -> list[list[float]]:
    """Wall times of each function over ``repeats`` rounds, the functions called in turn within a
    round (so that every one sees the same machine load); ``warmup`` untimed rounds first."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def summary(times: Sequence[float]) -> dict:
    """Median, quartiles and extremes of a list of timings (seconds)."""
    ts = sorted(times)
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {"median_s": round(statistics.median(ts), 5), "q1_s": round(q[0], 5), "q3_s": round(q[2], 5),
            "min_s": round(ts[0], 5), "max_s": round(ts[-1], 5), "n": len(ts)}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict:
    """The ratio of medians median(a) / median(b), and the median of the per-round ratios a_i / b_i
    (a paired statistic, robust to load that changes between rounds)."""
    per_round = [x / y for x, y in zip(a, b)]
    return {"ratio_of_medians": round(statistics.median(a) / statistics.median(b), 4),
            "median_paired_ratio": round(statistics.median(per_round), 4),
            "paired_ratio_q1_q3": [round(v, 4) for v in (statistics.quantiles(per_round, n=4)[0::2]
                                                         if len(per_round) >= 2 else per_round * 2)]}


def write_json(record: dict, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record.setdefault("machine", {})["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(record, indent=2) + "\n")
    return out
