"""Checks on the values recorded by book/04_audit.ipynb (run in the smoke profile)."""

import math


def check(records):
    zv = records["zero_variance"]
    assert zv["p05_n3"] == 0.25 and math.isclose(zv["p01_n3"], 0.9**3 + 0.1**3, rel_tol=1e-12)
    assert zv["mc_worst_z"] < 5
    assert records["runs_needed"] == {"0.05": 59, "0.1": 29, "0.2": 14, "0.5": 6}

    # the FinQA example: what 40 always-correct, 45 always-incorrect and 15 mixed samples allow
    fq = records["finqa"]
    assert math.isclose(fq["binary_mean_min"], 0.45) and math.isclose(fq["binary_mean_max"], 0.50)
    assert math.isclose(fq["best_of_3"], 0.55) and math.isclose(fq["max_gain"], 0.10)
    assert math.isclose(fq["max_gap_graded"], 2 / 3)
    assert fq["implied_always_wrong"] == 27 and (fq["implied_mixed_min"], fq["implied_mixed_max"]) == (21, 43)

    # the tiny audit (smoke: 32 prompts; cpu: 320): a 4-run audit with a sizeable mixed share, more always-wrong
    # than always-right prompts, and a best-of-4 well above the mean
    tiny = records["tiny_audit"]
    assert 0.25 <= tiny["mixed_share_4"] <= 0.6
    assert tiny["categories_4"]["always_wrong"] > tiny["categories_4"]["always_right"] > 0
    assert tiny["best_of_4"] - tiny["mean_4"] > 0.1
    assert abs(records["interval_coverage"] - 0.95) < 0.02
    miss = records["miss_share_3runs"]
    assert 0.2 <= miss["exact"] <= 0.6 and miss["z"] < 5
    shares = records["tiny_mixed_share_by_runs"]
    assert shares["2"] < shares["3"] < shares["4"]  # more runs reveal more mixed prompts

    # the prior's blind spot: two-digit multiplication never turns mixed after failing 4 runs
    by_level = records["hidden_signal_check"]["wrong_by_level"]
    assert by_level["mul2"]["prompts"] >= 1 and by_level["mul2"]["turned"] == 0

    # the supervised checkpoints: the mixed share rises, then falls, as the mean rises
    st = {row["stage"]: row for row in records["stages"]}
    assert st["early"]["mean"] < st["spread"]["mean"] < st["saturated"]["mean"]
    assert st["early"]["mixed"] < st["spread"]["mixed"] > st["saturated"]["mixed"]
    assert st["early"]["always_wrong"] > 0.5
    smol = records["smollm2"]
    assert 0 < smol["mean"] < 1  # it solves some of the runs, not all

    # monitoring the logged RL runs (stored data, the same in every profile): the share falls by step 30 and
    # over the plateau in every seed, never rises by 0.025 between two evaluations there, ends below half its start
    mon = records["monitoring"]
    assert all(d < 0 for d in mon["change_step_30"]) and all(s < 0 for s in mon["plateau_slopes_per_100"])
    assert mon["plateau_max_rise"] < 0.025
    assert mon["end_mean"] < 0.5 * sum(m[0] for m in mon["mixed"]) / len(mon["mixed"])

    # the multiplier table: the polar population saturates at 4/3 s_3, the near-edge one keeps growing
    for row in records["multiplier_rows"]:
        assert max(row["polar"]) <= 4 / 3 * row["s3"] + 1e-12
        assert row["edge"][-1] > 2 * row["polar"][-1]
        assert math.isclose(row["edge"][0], row["s3"]) and math.isclose(row["polar"][0], row["s3"])
