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

    # the tiny audit: categories partition the prompts, best-of-4 >= mean
    tiny = records["tiny_audit"]
    assert sum(tiny["categories_4"].values()) == tiny["prompts"]
    assert tiny["best_of_4"] >= tiny["mean_4"] - 1e-12
    assert abs(records["interval_coverage"] - 0.95) < 0.02
    miss = records["miss_share_3runs"]
    assert 0 <= miss["exact"] <= 1 and miss["z"] < 5
    shares = records["tiny_mixed_share_by_runs"]
    assert shares["1"] == 0.0  # one run never disagrees with itself

    for row in records["stages"]:
        assert math.isclose(row["always_wrong"] + row["mixed"] + row["always_right"], 1.0)
    smol = records["smollm2"]
    assert sum(smol["categories"].values()) == smol["prompts"]

    # the multiplier table: the polar population saturates at 4/3 s_3, the near-edge one keeps growing
    for row in records["multiplier_rows"]:
        assert max(row["polar"]) <= 4 / 3 * row["s3"] + 1e-12
        assert row["edge"][-1] > 2 * row["polar"][-1]
        assert math.isclose(row["edge"][0], row["s3"]) and math.isclose(row["polar"][0], row["s3"])
