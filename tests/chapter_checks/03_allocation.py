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
    # with prompts redrawn each step the between-prompt term dilutes the gains: the oracle saves at most a
    # few percent of the total noise for the linear and arcsine objectives, but most of it for the log
    totals = {(r["objective"], r["allocation"]): r for r in records["alloc_total_rows"]}
    for r in totals.values():
        assert r["se"] > 0 and abs(r["measured"] - r["total"]) < 5 * r["se"], r
    assert totals[("linear", "oracle")]["total"] >= 0.95 and totals[("arcsin", "oracle")]["total"] >= 0.95
    assert totals[("log", "oracle")]["total"] < 0.6
    # the arcsine's idealised row is an A/A control: a real measurement, not a hand-set 1
    assert rows[("arcsin", "idealised")]["se"] > 0
    # estimating p: GVM's exact-pilot net ratio (0.83 in the cpu profile) is a modest saving; a smoothed
    # 8-sample pilot leaves the log rule with about no net gain, the plug-in makes both lose, a 2-sample
    # smoothed pilot keeps part of the gain, and the linear rule breaks even below one rollout per prompt
    pilot = {(r["rule"], r["p_from"]): r for r in records["pilot_rows"]}
    gvm_rule = next(rule for rule, _ in pilot if "GVM" in rule)
    assert 0.7 < pilot[(gvm_rule, "exact, K = 8 pilot")]["net"] < 0.9
    assert abs(pilot[("log, idealised", "K = 8, Beta(1,1)")]["net"] - 1) < 0.1
    for rule in ("log, idealised", gvm_rule):
        assert pilot[(rule, "K = 8, k/K")]["net"] > 2, rule
        assert pilot[(rule, "K = 2, Beta(1,1)")]["net"] < min(1.0, pilot[(rule, "K = 8, Beta(1,1)")]["net"]), rule
    assert 8 * (1 / pilot[("linear, idealised", "exact, free")]["train_only"] - 1) < 1
    # a pilot merged into training does better than a discarded one (its bias aside)
    merged = records["pilot_merged"]
    for rule in ("log, idealised", gvm_rule):
        assert merged[rule]["beta"] < pilot[(rule, "K = 8, Beta(1,1)")]["net"] - 0.1, rule
    # a floor of two rollouts per prompt barely changes the log rules' gains
    for kind, r in records["log_nmin2"].items():
        assert r["single"] > 0 and 0 <= r["ratio_nmin2"] - r["ratio_nmin1"] < 0.02, (kind, r)
    # RAFT's real weight pass@8(p)/p departs from the idealised 1/p, and GVM's allocation turns its update
    raft = records["raft_real_weight"]
    assert raft["weight_ratio_min"] < 0.2 and raft["turn_vs_log_deg"] > 2 and raft["gvm_turn_deg"] > 1
    assert raft["norm_vs_log"] < 0.9
    # GVM-GRPO: GVM's allocation raises the variance at a fixed arcsine weight and zeroes single-rollout prompts
    gg = records["gvm_grpo"]
    assert gg["ratio_arcsine"] > 1.5 and gg["single"] > 0 and gg["shift_min"] == 0 and gg["shift_max"] > 1
    # the baseline: little effect at uniform (the hard prompts dominate), and it raises sigma^2 on easy prompts
    be = records["baseline_effect"]
    assert 0.9 < be["ratio"] < 1 and be["hard_share"] > 0.8 and be["n_raised"] > 0 and be["p_min_raised"] > 0.5
    assert be["easy_n_log_oracle"] > be["easy_n_raft_oracle"]
    # with pass rates in [0.1, 0.9] the linear objective's idealised rule loses to uniform on every draw
    assert min(records["tail_linear_idealised"]["0.1"]) > 1
    # the rule on the tiny model's audited pass rates (cross-fitted): fed the plug-in k/n it is noisier than
    # uniform on the main pool, because prompts whose runs agree get n_min = 2 (their variance counted 8/2 = 4
    # times) while the others' falls; smoothed, it saves a few percent on both pools. The oracle arm's runs put
    # more of their rollouts in mixed groups than uniform's.
    model = records["model_alloc"]
    assert sorted(model) == ["hard", "main"]
    main_plug, main_smooth = model["main"]["6"]["plug_in"], model["main"]["6"]["smoothed"]
    assert main_plug["low"] > 1 and main_smooth["high"] < 1 and main_plug["low"] <= main_plug["ratio"] <= main_plug["high"]
    assert model["main"]["4"]["plug_in"]["ratio"] > main_plug["ratio"]        # fewer runs, a worse allocation
    assert abs(model["main"]["fitted"]["1"]["cross_fit_6"][0] - main_plug["ratio"]) < 0.15
    chosen = model["main"]["fitted"][str(model["main"]["fit_chosen"])]
    assert chosen["oracle_8"][0] < chosen["cross_fit_6"][0]  # the oracle's 8 runs starve fewer prompts than 6
    for pool in model.values():
        plug = pool["6"]["plug_in"]
        # the mechanism: the prompts whose runs agree get n_min = 2 of uniform's 8 (4 times the variance; below 4
        # only in the rare step with too few other prompts to take the rest), the others gain
        assert pool["6"]["smoothed"]["ratio"] < 1 and math.isclose(plug["agreed"], 4, rel_tol=0.05) and plug["others"] < 1
        # pools drawn from Beta fits to the audit put the 6-run cross-fit above 1, like the measurement
        assert pool["fit_chosen"] in (1, 2, 3) and "1" in pool["fitted"] and "2" in pool["fitted"]
        for fitted in pool["fitted"].values():
            assert fitted["cross_fit_6"][0] > 1
        (uniform, _, n_uniform), (oracle, _, n_oracle) = pool["mixed_share"]["uniform"], pool["mixed_share"]["oracle_alloc"]
        assert n_uniform == n_oracle == 8 and oracle > uniform + 0.2
