"""How long `rlcurate advise` takes on an audit of 2,000 prompts x 8 runs (issue #29, chapter 11).

A synthetic audit (30 % of the prompts never solved, 20 % always, the rest Beta(2, 2)) is written in the
format `rlcurate audit` writes, then advise reads it `--repeats` times with and without the simulation,
alternately in one process. Seconds on the CPU; the result goes to ``data/bench/advise_2000.json``:

    .venv/bin/python bench/bench_advise.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, summary, write_json  # noqa: E402


def synthetic_audit(folder: Path, prompts: int = 2000, runs: int = 8, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    p = np.r_[np.zeros(int(0.3 * prompts)), np.ones(int(0.2 * prompts)), rng.beta(2, 2, prompts - int(0.5 * prompts))]
    k = rng.binomial(runs, p)
    uids = [f"p{i}" for i in range(prompts)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"format": "rlcurate-audit/1", "samples": uids, "n_samples": prompts,
                                                    "config": {"model": "synthetic", "task": "synthetic", "runs": runs,
                                                               "success_threshold": 1.0}}))
    with open(folder / "runs.jsonl", "w") as f:
        for i, ki in enumerate(k):
            for r in range(runs):
                f.write(json.dumps({"index": i, "uid": uids[i], "run": r, "score": float(r < ki), "n_tokens": 1,
                                    "finish_reason": "stop"}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(DATA / "advise_2000.json"))
    args = ap.parse_args()
    from rlcurate.advise import advise

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "audit"
        synthetic_audit(folder)
        times = {"no_sim": [], "sim": []}
        for _ in range(args.repeats):
            for key in times:
                t0 = time.perf_counter()
                a = advise(folder, sim=key == "sim")
                times[key].append(time.perf_counter() - t0)
    result = {**header("rlcurate advise on a synthetic audit of 2,000 prompts x 8 runs (100 bootstrap refits, "
                       "4 simulated seeds)", threads=1),
              "config": {"prompts": 2000, "runs": 8, "repeats": args.repeats, "boots": 100, "sim_seeds": 4},
              **{key: summary(v) for key, v in times.items()}, "verdict": a.verdict}
    write_json(result, args.out)
    print(f"advise on 2,000 prompts x 8 runs: {result['no_sim']['median_s']:.1f} s without the simulation, "
          f"{result['sim']['median_s']:.1f} s with it (medians of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
