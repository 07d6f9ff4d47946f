"""Checks on the values recorded by book/A3_pretrained.ipynb (run in the smoke profile)."""


def check(records):
    audit = records["audit"]
    levels = audit["levels"]
    assert set(levels) >= {"add1", "add2", "sub1", "sub2", "mul1", "mul2x1"}
    for lv, row in levels.items():
        assert row["prompts"] > 0 and 0 <= row["mean"] <= 1
        assert abs(row["mixed"] + row["right"] + row["wrong"] - 1) < 1e-9, lv
    assert audit["chosen_mixed"] >= 0.2
    # the shared prefix makes the step cheaper in both halves (data/bench/prefix_share_smollm2.json)
    share = records["prefix_share"]
    assert share is not None and all(0 < r < 1 for r in share.values()), share
    comp = records["comparison"]
    assert comp["planned"] == {"smollm2_lr": 30, "smollm2_protocol": 48}
    assert all(0 <= comp["finished"][k] <= comp["planned"][k] for k in comp["planned"])
    # an arm is in the table only with all 8 seeds; a complete suite has every arm in it
    if comp["finished"]["smollm2_protocol"] == comp["planned"]["smollm2_protocol"]:
        assert comp["table"] is not None and not comp["pending"]
    # a rate is chosen for every arm exactly when the sweep has finished, and only then is power planned
    sweep = records["sweep"]
    finished = comp["finished"]["smollm2_lr"] == comp["planned"]["smollm2_lr"]
    assert all(v is not None for v in sweep["chosen"].values()) == finished
    assert (sweep["planned_detectable"] is not None) == finished
    if finished:
        assert set(sweep["chosen"].values()) <= {3e-6, 1e-5, 3e-5}
        assert 0 < sweep["planned_detectable"] < 1
    table = comp["table"]
    if table is not None:
        assert set(table) == {"final", "area"}
        for measure, rows in table.items():
            assert set(rows) == {"uniform_aa", "dapo", "ada_seq_n4", "insight", "combined"} - set(comp["pending"]), measure
            assert all(r["seeds"] == 8 and r["low"] <= r["mean"] <= r["high"] for r in rows.values()), measure
            # the A/A control covers zero, or the protocol is broken
            assert rows["uniform_aa"]["low"] <= 0 <= rows["uniform_aa"]["high"], measure
        assert 0 < comp["detectable"] < 1
        regime = records["regime"]
        # the samplers spend more rollouts per step than uniform's 64, so take fewer steps in the budget
        assert regime["uniform"]["rollouts_per_step"] == 64
        assert all(regime[a]["steps"] < regime["uniform"]["steps"] for a in ("dapo", "ada_seq_n4"))
        hinted = regime.get("combined", {}).get("hinted")
        assert hinted is None or 0 <= hinted <= 1
    # the revisited pool: a subset of the comparison's (A3 asserts it), seen several times in the budget
    revisit = records["revisit"]
    assert revisit["pool"] < 361 and 0 <= revisit["finished"] <= 40
    if revisit["table"] is not None:
        assert not {"uniform", "uniform_aa", "insight", "combined"} & set(revisit["pending"])
        for measure, rows in revisit["table"].items():
            assert set(rows) == {"uniform_aa", "insight", "combined", "combined_failures"} - set(revisit["pending"]), measure
            assert all(r["seeds"] == 8 and r["low"] <= r["mean"] <= r["high"] for r in rows.values()), measure
            assert rows["uniform_aa"]["low"] <= 0 <= rows["uniform_aa"]["high"], measure
        assert 0 <= revisit["hinted"] <= 1 and 0 <= revisit["same_as_insight"] <= 8
        assert 0 < revisit["detectable"] < 1
    # the hint measured on the untrained model: pass rates in [0, 1] on the prompts that have one
    hint = records["hint_effect"]
    assert 0 < hint["prompts"] < 66 and 0 <= hint["plain"] <= 1 and 0 <= hint["hinted"] <= 1
    assert hint["low"] <= hint["hinted"] - hint["plain"] <= hint["high"]
