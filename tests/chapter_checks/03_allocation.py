"""Checks on the values recorded by book/03_allocation.ipynb (run in the smoke profile)."""

import math


def check(records):
    rows = {(r["objective"], r["allocation"]): r for r in records["alloc_rows"]}
    assert set(rows) == {(o, a) for o in ("linear", "log", "arcsin") for a in ("idealised", "oracle")}
    for r in rows.values():
        if r["se"] > 0:
            assert abs(r["measured"] - r["exact"]) < 5 * r["se"], r
        if r["allocation"] == "oracle":
            assert 0 < r["exact"] <= 1 + 1e-12             # the true optimum never loses to uniform
    assert rows[("arcsin", "idealised")]["exact"] == 1.0   # for the arcsine the idealised rule is uniform
    assert rows[("log", "idealised")]["exact"] < 0.6       # large gain for the log objective
    assert rows[("log", "oracle")]["exact"] <= rows[("log", "idealised")]["exact"] + 1e-12
    assert rows[("linear", "oracle")]["exact"] <= rows[("linear", "idealised")]["exact"] + 1e-12
    assert rows[("arcsin", "oracle")]["ideal"] > 1         # the idealised model calls the oracle worse
    for r in records["gvm_rows"]:
        assert abs(r["measured"] - r["exact"]) < 5 * r["se"], r
    gvm = {r["allocation"]: r["exact"] for r in records["gvm_rows"]}
    assert gvm["oracle"] <= records["gvm_alpha0_ratio"] + 1e-12 <= gvm["GVM"] + 1e-12
    assert records["alloc_max_abs_z"] < 5
    assert math.isclose(records["log_rule_ratio_001_vs_05"], math.sqrt(99))
    assert math.isclose(records["power_peak_alpha075"], 1 / 3)
    bf = records["brute_force_case"]
    assert bf["greedy"] == bf["brute"] == [8, 5, 2, 1]
    tail = records["tail_log_gain"]
    gains = [tail[k] for k in ("0.1", "0.01", "0.001", "0.0001")]
    assert all(a > b for a, b in zip(gains, gains[1:]))    # heavier hard tails, larger gains
