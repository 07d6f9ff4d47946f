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
    # GRPO's weight depends on the group size (issue #16): 1/sqrt(2) at every p for n = 2, growing with n
    w = {int(n): v for n, v in records["grpo_weight_by_n"].items()}
    assert all(abs(x - 2 ** -0.5) < 1e-6 for x in w[2])
    sizes = sorted(w)
    for i in range(len(w[2])):
        assert all(w[a][i] < w[b][i] for a, b in zip(sizes, sizes[1:])), i
    g = records["grpo_arcsine_oracle"]
    assert 0 < g["grpo8_vs_arcsine_deg"] < 90 and g["n_min"] < g["n_max"]
    # the ablation of the idealised rule: the oracle is the optimum, and fixing step 3 alone (S_i) is worse
    # than ignoring S_i altogether (steps 2 and 3 fail together)
    abl = records["alloc_ablation"]
    oracle = abl["sigma^2: oracle"]
    for name, row in abl.items():
        for obj, ratio in row.items():
            assert oracle[obj] <= ratio + 1e-9, (name, obj)
    for obj in ("linear", "arcsin", "log"):
        assert abl["p(1-p) S: step 3 undone"][obj] > abl["p(1-p): steps 1-3 (idealised)"][obj], obj
    spread = records["rho_S_spread"]
    assert spread["corr"] < 0 and spread["sd_log_rho_S"] < min(spread["sd_log_rho"], spread["sd_log_S"])
    # with prompts redrawn each step the between-prompt term dilutes every gain: within <= total <= 1
    for r in records["alloc_total_rows"]:
        assert r["within"] - 1e-9 <= r["total"] <= max(1.0, r["within"]) + 1e-9, r
        if r["se"] > 0:
            assert abs(r["measured"] - r["total"]) < 5 * r["se"], r
    # estimating p costs rollouts: the net ratio never beats the training-only one
    for r in records["pilot_rows"]:
        assert r["net"] >= r["train_only"] - 1e-12, r
