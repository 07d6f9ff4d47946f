"""Coverage of the bootstrap interval of :func:`rlcurate.stats.cross_fitted_allocation_ratio` (chapter 3, *On the
models*), in the setting of the chapter's synthetic pools (every fourth held-out pair, one pass over the pool).

Synthetic pools with known pass rates, the Beta(1, 1)-smoothed rates of the tiny model's main-pool audit, draw 8
pass/fail runs per prompt. The target is what the interval estimates: the same allocations (from the same
synthetic runs) scored with the exact p (1 - p) in place of the held-out estimate, averaged over the pools.
Writes data/checks/allocation_coverage.json. Costs about 25 minutes of one core at 150 pools:

    python scripts/allocation_coverage.py --pools 150
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from rlcurate.audit.summary import load_audit
from rlcurate.stats import cross_fitted_allocation_ratio, plug_in_allocation_ratio, smooth_pass_rate

REPO = Path(__file__).resolve().parents[1]
HELD_OUT = list(itertools.combinations(range(8), 2))[::4]
ALLOC_RUNS = 6


def audit_pass_rates(name="spread_train48"):
    """The audit's Beta(1, 1)-smoothed pass rates, one a prompt (chapter 4's reader)."""
    scores = load_audit(REPO / "data" / "audits" / name).scores
    return smooth_pass_rate(np.array([s.sum() for s in scores]), np.array([s.size for s in scores]))


def exact_ratio(scores, p_true, smoothed):
    """The estimand: the allocations cross_fitted_allocation_ratio makes (from the runs each held-out pair leaves),
    scored with the exact p (1 - p); every pair's uniform sum is the same, so the mean of the pairs' ratios."""
    return float(np.mean([plug_in_allocation_ratio(p_true, scores[:, [j for j in range(scores.shape[1])
                                                                       if j not in held][:ALLOC_RUNS]], smoothed)
                          for held in HELD_OUT]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=150, help="synthetic pools per rule (default 150)")
    args = parser.parse_args()
    p_true = audit_pass_rates()
    out = {"pools": args.pools, "held_out_pairs": len(HELD_OUT), "alloc_runs": ALLOC_RUNS}
    for name, smoothed in (("plug_in", False), ("smoothed", True)):
        intervals, targets = [], []
        for rep in range(args.pools):
            scores = (np.random.default_rng(100 + rep).random((p_true.size, 8)) < p_true[:, None]).astype(float)
            r = cross_fitted_allocation_ratio(scores, ALLOC_RUNS, smoothed, 1, held_out=HELD_OUT, seed=0)
            intervals.append((r["ratio"], r["low"], r["high"]))
            targets.append(exact_ratio(scores, p_true, smoothed))
        est, target = np.array(intervals), float(np.mean(targets))
        out[name] = {"target": target, "mean_estimate": float(est[:, 0].mean()),
                     "coverage": float(np.mean((est[:, 1] <= target) & (target <= est[:, 2])))}
        print(name, out[name], flush=True)
    path = REPO / "data" / "checks" / "allocation_coverage.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
