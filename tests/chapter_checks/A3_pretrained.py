"""Checks on the values recorded by book/A3_pretrained.ipynb (run in the smoke profile)."""

from rlcurate.comparison import detectable_difference, holm


def check_family(table, family, repeats):
    """Holm's family holds each distinct arm once: the adjusted p values are Holm's over the family's own t-test
    p values, and an exact repeat (left out of the family) has its twin's row."""
    assert not set(family) & set(repeats) and all(t in family for t in repeats.values()), (family, repeats)
    assert not any(a.endswith("_aa") for a in family)
    adjusted = holm({a: table[a]["p_t"] for a in family})
    assert all(abs(table[a]["p_holm"] - adjusted[a]) < 1e-12 for a in family), (adjusted, table)
    assert all(table[a] == table[t] for a, t in repeats.items())
    # a control is tested alone: its adjusted p is its own
    assert all(r["p_holm"] == r["p_t"] for a, r in table.items() if a.endswith("_aa"))


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
    regime = records["regime"]
    if table is not None:
        assert set(table) == {"final", "area"}
        for measure, rows in table.items():
            assert set(rows) == {"uniform_aa", "dapo", "ada_seq_n4", "insight", "combined"} - set(comp["pending"]), measure
            assert all(r["seeds"] == 8 and r["low"] <= r["mean"] <= r["high"] for r in rows.values()), measure
            # the A/A control covers zero, or the protocol is broken
            assert rows["uniform_aa"]["low"] <= 0 <= rows["uniform_aa"]["high"], measure
            check_family(rows, comp["family"], comp["repeats"])
        # the combined recipe never rolled a hint at 0.66 visits: it repeats INSIGHT and is counted once
        if records["regime"].get("combined_equals_insight", {}).get("same") == 8:
            assert comp["repeats"] == {"combined": "insight"}, comp["repeats"]
            assert sorted(comp["family"]) == ["ada_seq_n4", "dapo", "insight"]
        # what eight seeds can see, per distinct arm and the A/A control, from the arm's own paired sd
        det = records["detectable"]
        assert det["seeds"] == 8 and det["family"] == len(comp["family"])
        for measure in ("final", "area"):
            rows = det[measure]
            assert set(rows) == set(comp["family"]) | {"uniform_aa"}, measure
            for arm, r in rows.items():
                assert r["sd"] > 0 and 0 < r["at_5"] <= r["at_holm"] < 1, (measure, arm)
                assert abs(r["at_5"] - detectable_difference(r["sd"], 8)) < 1e-12
                assert abs(r["at_holm"] - detectable_difference(r["sd"], 8, arms=det["family"])) < 1e-12
            # the line rises with the spread: a noisier arm needs a larger true difference
            order = sorted(rows.values(), key=lambda r: r["sd"])
            assert all(a["at_5"] <= b["at_5"] for a, b in zip(order, order[1:])), measure
        # equal optimizer steps: every arm of the family read at its own fewest steps against uniform at as many
        steps = dict(records["equal_steps"])
        conservative = steps.pop("conservative")
        assert set(steps) == set(table["final"]) - {"uniform_aa"}
        check_family({a: {"p_t": r["p_t"], "p_holm": r["p_holm"]} for a, r in steps.items()}, comp["family"],
                     comp["repeats"])
        for arm, r in steps.items():
            assert r["seeds"] == 8 and r["low"] <= r["diff"] <= r["high"], arm
            assert 0 < r["steps"] <= regime["uniform"]["steps"], arm
        for arm in ("dapo", "ada_seq_n4"):
            # the samplers take fewer steps than uniform, so equal steps is a different reading from the budget's
            assert steps[arm]["steps"] <= regime[arm]["steps"] < regime["uniform"]["steps"], arm
        for arm, r in steps.items():
            if steps[arm]["steps"] == regime["uniform"]["steps"]:  # at uniform's steps it is the budget's comparison
                assert abs(r["diff"] - table["final"][arm]["mean"]) < 1e-9, arm
        for arm, r in conservative.items():  # uniform read at its next evaluation, after more steps than the arm
            assert r["uniform_steps"] > r["steps"] == steps[arm]["steps"] and r["low"] <= r["diff"] <= r["high"]
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
            check_family(rows, revisit["family"], revisit["repeats"])
        assert 0 <= revisit["hinted"] <= 1 and 0 <= revisit["same_as_insight"] <= 8
        for measure, rows in revisit["detectable"].items():
            assert set(rows) == set(revisit["family"]) | {"uniform_aa"}, measure
            assert all(r["sd"] > 0 and 0 < r["at_5"] <= r["at_holm"] < 1 for r in rows.values()), measure
    # the hint measured on the untrained model: pass rates in [0, 1] on the prompts that have one
    hint = records["hint_effect"]
    assert 0 < hint["prompts"] < 66 and 0 <= hint["plain"] <= 1 and 0 <= hint["hinted"] <= 1
    assert hint["low"] <= hint["hinted"] - hint["plain"] <= hint["high"]
    # twice the budget (smollm2_long): every arm with its eight seeds, the A/A control covering zero, Holm over the
    # two arms, and the first budget read on the same runs
    long = records.get("long_budget")
    if long is not None:
        assert long["budget"] == 3840 and set(long["arms"]) == {"uniform", "uniform_aa", "insight", "dapo"}
        assert set(long) >= {"final", "area", "half"}
        for measure in ("final", "area", "half"):
            rows = long[measure]
            assert set(rows) == {"uniform_aa", "insight", "dapo"}, measure
            assert all(r["low"] <= r["diff"] <= r["high"] for r in rows.values()), measure
            assert rows["uniform_aa"]["low"] <= 0 <= rows["uniform_aa"]["high"], measure
            assert all(0 <= r["p_holm"] <= 1 for r in rows.values()), measure
    # the revisited pool's rates tuned on it (smollm2_revisit_lr, its declared rule): uniform keeps 1e-5, so its runs
    # and the A/A control's stand; the tuned arms' table (smollm2_revisit_tuned) once an arm has its eight seeds
    tuned = records["revisit_tuned"]
    assert tuned["tie"] == 0.005 and set(tuned["chosen"]) == {"uniform", "insight", "combined", "combined_failures"}
    assert tuned["chosen"]["uniform"] == 1e-5 and set(tuned["chosen"].values()) <= {3e-6, 1e-5, 3e-5}
    if tuned["table"] is not None:
        for measure, rows in tuned["table"].items():
            assert "uniform_aa" in rows and rows["uniform_aa"]["low"] <= 0 <= rows["uniform_aa"]["high"], measure
            assert all(r["low"] <= r["mean"] <= r["high"] and r["seeds"] == 8 for r in rows.values()), measure
            check_family(rows, tuned["family"], tuned["repeats"])
    # the revisited pool read with 16 samples per test prompt (smollm2_revisit_precise), once every arm has its seeds
    precise = records["revisit_precise"]
    assert precise["samples"] == 16 and 0 <= precise["finished"] <= 40
    if precise["table"] is not None:
        assert precise["finished"] == 40
        for measure, rows in precise["table"].items():
            assert set(rows) == {"uniform_aa", "insight 3e-06", "combined 3e-06", "combined_failures 3e-06"}, measure
            assert all(r["low"] <= r["mean"] <= r["high"] and r["seeds"] == 8 for r in rows.values()), measure
            check_family(rows, precise["family"], precise["repeats"])
        assert set(precise["sd_4_to_16"]) == set(precise["table"]["final"])
        assert all(s4 > 0 and s16 > 0 for s4, s16 in precise["sd_4_to_16"].values())
        assert set(precise["same_training"]) == {"uniform", "uniform_aa", "insight", "combined", "combined_failures"}
        assert all(0 <= n <= 8 for n in precise["same_training"].values())
    # the paired interval's coverage on SmolLM2's own noise: 15 distinct comparisons x 8 seeds, resampled; within
    # a point of the nominal 0.95 (a shape the t interval cannot carry gives far less, tests/test_comparison.py)
    cover = records["coverage"]
    if cover is not None:
        for measure in ("final", "area"):
            r = cover[measure]
            assert r["comparisons"] == 15 and r["n"] == 120, measure
            assert abs(r["coverage"] - 0.95) < 0.01 and 0 < r["se"] < 0.005, (measure, r)
        assert all(all(by.values()) for by in cover["aa_covers_zero"].values()) and len(cover["aa_covers_zero"]) == 4
