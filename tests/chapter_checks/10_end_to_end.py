"""Checks on the values recorded by book/10_end_to_end.ipynb (run in the smoke profile)."""


def _interval_ok(row):
    return row["low"] <= row["diff"] <= row["high"]


def check(records):
    # the paired t interval holds its level on synthetic curves (8 and 3 seeds, three kinds of noise)
    assert all(0.9 <= c <= 1.0 for c in records["coverage"].values())
    sim = records["sim"]
    assert sim["lr"]["uniform_aa"] == sim["lr"]["uniform"]
    for table in (sim["final"], sim["area"]):
        assert "uniform" not in table and "uniform_aa" in table
        assert all(_interval_ok(r) for r in table.values())
    tiny = records["tiny"]
    for table in tiny.values():
        assert "uniform" not in table and table["uniform_aa"]["seeds"] >= 8
    # the committed runs (read in every profile) carry the chapter's claims: at the budget every arm ends below
    # uniform and survives Holm; in area INSIGHT and MoPPS are indistinguishable from noise
    final, area = tiny["held-out accuracy at 12,800 rollouts"], tiny["area under the curve"]
    arms = [a for a in final if not a.endswith("_aa")]
    assert len(arms) == 9 and all(final[a]["high"] < 0 and final[a]["p_holm"] < 0.05 for a in arms), final
    assert all(area[a]["low"] < 0 < area[a]["high"] for a in ("insight", "mopps")), area
    assert 0.015 < records["tiny_power"]["detectable"] < 0.04
    # taken as one family over both measures, INSIGHT's and Ada-Est's losses at the budget no longer survive
    joint = records["tiny_joint_holm"]
    assert len(joint) == 18 and joint["insight (budget)"] >= 0.05 and joint["ada_est_hybrid (budget)"] >= 0.05
    # in the papers' currency DAPO is ahead and Ada-Seq at n = 4 indistinguishable; reading uniform by a monotone
    # cubic instead of a straight line raises it a little (its curve is concave), never by more than 0.01
    steps = records["equal_steps"]
    assert steps["dapo"]["low"] > 0 and steps["ada_seq_n4"]["low"] < 0 < steps["ada_seq_n4"]["high"]
    assert all(0 <= v < 0.01 for v in records["equal_steps_pchip_shift"].values())
    for key, row in records["aa"].items():
        assert _interval_ok(row) and row["seeds"] >= 8, key
    for arm, g in records["regime"].items():
        assert 0 < g["trained_share"] <= 1 and 0 <= g["mixed"] <= 1, arm
        assert g["finished"] is None or 0 <= g["finished"] <= 1, arm
    assert records["regime"]["uniform"]["steps"] == 100  # 12,800 rollouts of 16 x 8
    assert records["rho"]["cpu"] > 1 and records["rho"]["gpu_256"] < records["rho"]["gpu_1024"]
    # with verl-style dense training at the CPU's rho, DAPO and Ada-Seq (n = 4) are indistinguishable from uniform
    dense = records["currencies"]["cost_dense (rho 2.44)"]
    assert all(dense[a]["low"] < 0 < dense[a]["high"] for a in ("dapo", "ada_seq_n4")), dense
    # the dense currency across rho (suite protocol_rho): at rho measured again (2.79), the declared primary endpoint,
    # DAPO and Ada-Seq (n = 4) are indistinguishable from uniform and Ada-Seq (n = 8) behind after Holm; across rho
    # the samplers catch up (each interval covers zero from some rho on) and none is ahead beyond noise up to 5
    assert records["rho"]["cpu"] < records["rho"]["cpu_remeasured"]
    by_rho = records.get("dense_by_rho")
    if by_rho:
        assert sorted(map(float, by_rho)) == [0.5, 1, 1.43, 2, 2.44, 2.79, 3, 4, 5]
        for rho, table in by_rho.items():
            assert set(table) == {"uniform_aa", "uniform_order2_aa", "dapo", "ada_seq_n4", "ada_seq_n8"}, rho
            assert all(_interval_ok(r) for r in table.values()), rho
            assert all(r["high"] > -0.02 and r["low"] < 0.02 for a, r in table.items() if a.endswith("_aa")), rho
        primary = by_rho["2.79"]
        assert all(primary[a]["low"] < 0 < primary[a]["high"] for a in ("dapo", "ada_seq_n4")), primary
        assert primary["ada_seq_n8"]["high"] < 0 and primary["ada_seq_n8"]["p_holm"] < 0.05, primary
        for arm, first in (("dapo", "1"), ("ada_seq_n4", "2"), ("ada_seq_n8", "4")):
            rhos = sorted(by_rho, key=float)
            covers = [k for k in rhos if by_rho[k][arm]["low"] < 0 < by_rho[k][arm]["high"]]
            assert covers == rhos[rhos.index(first):], (arm, covers)
            assert all(by_rho[k][arm]["low"] < 0 for k in rhos), arm  # never ahead beyond noise
        # with this trainer's sparse training every sampler stays behind at every rho (read after the runs)
        sparse = records["sparse_by_rho"]
        assert all(sparse[k][a]["high"] < 0 and sparse[k][a]["p_holm"] < 0.05 for k in sparse
                   for a in ("dapo", "ada_seq_n4", "ada_seq_n8")), sparse
        # advise predicts a dense-cost saving for DAPO on this pool that the runs do not show (the text says so)
        pred = records.get("rho_advice_dapo")
        if pred:
            assert pred["high"] < 1 and primary["dapo"]["low"] < 0 < primary["dapo"]["high"], (pred, primary)
        orders = records["dense_by_rho_orders"]
        assert all(orders[a]["low"] < 0 < orders[a]["high"] for a in ("dapo", "ada_seq_n4")), orders
    # the replication on seeds 8-15 (suite protocol_rho_replication, declared): (a) and (c) replicate, (b) does not;
    # its fresh A/A order covers zero; pooled over 16 seeds Ada-Seq (n = 4) is ahead at rho 4 and 5 (the text's
    # descriptive reading, tested by protocol_rho_high below) and DAPO level
    rep = records.get("replication_primary")
    if rep:
        assert records["replication_verdicts"] == {"(a) no sampler ahead": True, "(b) ada_seq_n8 behind": False,
                                                   "(c) dapo and ada_seq_n4 level": True}
        assert all(_interval_ok(r) for r in rep.values()) and rep["uniform_order3_aa"]["low"] < 0 < rep["uniform_order3_aa"]["high"]
        pooled = records["replication_pooled"]
        assert all(pooled[k]["ada_seq_n4"]["low"] > 0 and pooled[k]["ada_seq_n4"]["p_holm"] < 0.05 for k in ("4", "5")), pooled
        assert all(pooled[k]["dapo"]["low"] < 0 < pooled[k]["dapo"]["high"] for k in ("2.79", "4", "5")), pooled
        assert all(r["seeds"] == 16 for t in pooled.values() for r in t.values())
    # the declared test of that reading on seeds 16-31 (suite protocol_rho_high): Ada-Seq (n = 4) ahead at rho 5 with
    # p < 0.05, its fresh A/A order covering zero; pooled over 32 seeds ahead at 4 and 5, the pooled A/A covering zero
    high = records.get("rho_high_primary")
    if high:
        n4, aa = high["ada_seq_n4"], high["uniform_order4_aa"]
        assert records["rho_high_confirmed"] is True and n4["low"] > 0 and n4["p"] < 0.05 and n4["seeds"] == 16
        assert aa["low"] < 0 < aa["high"] and _interval_ok(n4)
        p32 = records["rho_pooled32"]
        assert all(p32[k]["ada_seq_n4"]["low"] > 0 and p32[k]["ada_seq_n4"]["seeds"] == 32 for k in ("4", "5")), p32
        assert all(p32[k]["A/A"]["low"] < 0 < p32[k]["A/A"]["high"] for k in p32), p32
    # what a dense trainer should do (suite protocol_rho_sparse_uniform, declared): uniform GRPO that skips
    # zero-advantage rollouts is indistinguishable from densely trained Ada-Seq at the rho = 5 budget; the long runs repeat
    # protocol_rho_high's uniform runs up to 12,800 rollouts
    su = records.get("sparse_uniform_primary")
    if su:
        assert su["pairing"] is True and su["seeds"] == 16 and _interval_ok(su)
        assert su["low"] < 0 < su["high"] and su["p"] > 0.05, su
        assert all(_interval_ok(r) for r in records["sparse_uniform_readings"].values())
    filtered_steps = records.get("filtered_equal_steps")
    if filtered_steps:
        assert all(r["low"] < 0 < r["high"] for r in filtered_steps.values()), filtered_steps
    live = records["live"]
    assert live["uniform"]["rollouts"] == live["uniform"]["steps"] * 4 * 8
    # every A/A comparison (two pools, two orders, two measures) as one Holm family
    if "aa_family_holm" in records:
        holm = records["aa_family_holm"]
        assert len(holm) == 8 and all(0 <= p <= 1 for p in holm.values())
    # every pairwise comparison of uniform's three prompt orders (two pools, two measures), Holm across the twelve;
    # the orders are rebuilt from the trainer's selector and overlap as independent orders do
    if "order_pairs" in records:
        pairs = records["order_pairs"]
        assert len(pairs) == 12 and all(0 <= r["p_t"] <= r["p_holm"] <= 1 for r in pairs.values()), pairs
        mech = records["order_mechanism"]
        assert abs(mech["overlap"] - mech["overlap_independent"]) < 1 and mech["max_abs_rank_corr"] < 0.15
        assert all(0 < p <= 1 for p in mech["p_family_permutation"].values())
    # the selector's loop with hints that do not help (simulated): a hinted group skipped by the beliefs
    # narrows the prompts chosen; counting its failures gives INSIGHT's spread back
    trap = records["hint_trap_sim"]
    alone, skip = trap["INSIGHT"]["distinct"], trap["INSIGHT + SAGE-LIGHT"]["distinct"]
    assert skip < 0.8 * alone and trap["INSIGHT + SAGE-LIGHT, hinted failures counted"]["distinct"] > 0.9 * alone, trap
    # the hinting arms' own suite (issue #28): SAGE alone and the recipe with hinted failures counted
    hints = records.get("hints")
    if hints:
        for table in hints.values():
            assert set(table) == {"sage", "sage_light", "combined_failures"}
            for arm, r in table.items():
                assert r["low"] <= r["diff"] <= r["high"] and 0 <= r["p_holm"] <= 1, arm
        fixed = records["combined_failures_vs_combined_final"]
        assert fixed["low"] > 0  # counting hinted failures removes the recipe's collapse
    # the interval's coverage on the tiny model's own noise (resampled): at its level at the budget, slightly
    # liberal in area (skewed differences), as the text says
    cover = records["tiny_coverage"]
    if cover is not None:
        assert abs(cover["final"]["coverage"] - 0.95) < 0.01 and len(cover["final"]["leave_one_out"]) == 11
        assert 0.90 < cover["area"]["coverage"] < 0.945 and cover["area"]["skewness"] > cover["area"]["normal_skewness"][1]
