"""Checks on the values recorded by book/06_adaptive_sampling.ipynb (run in the smoke profile)."""

import math


def check(records):
    st = records["stopping"]
    # the positive rule with K successes costs K/p rollouts; the balanced (2 + 2) rule at p = 1/2 costs 5.5
    assert math.isclose(st["pos_k4_p08"], 5.0, rel_tol=1e-9) and math.isclose(st["pos_k4_p005"], 80.0, rel_tol=1e-9)
    assert math.isclose(st["bal_k2_p05"], 5.5, rel_tol=1e-9)
    assert st["closed_form_gap"] < 1e-9 and st["mc_worst_z"] < 5
    assert st["pos_k4_p005_capped"] < 32 and 0 < st["pos_k4_p005_finish"] < 1

    w = records["weights"]
    assert w["mc_worst_z"] < 5
    # the 1/p_hat correction over-weights p = 0.1 about fourfold; the fixed correction does not
    assert 3.5 < w["overweight_p01_inverse_p"] < 4.5 and 0.8 < w["overweight_p01_fixed"] < 1.1

    cm = records["cost_model"]
    assert cm["rho_bound_15b"] > 1 and cm["rho_bound_7b"] > cm["rho_bound_15b"]
    assert records["sim"]["cos_objectives"] > 0.9

    tiny = records["tiny_protocol"]  # chapter 10's protocol runs of the samplers
    assert "diff" not in tiny["uniform"] and tiny["uniform"]["steps"] == 100
    for arm, row in tiny.items():
        assert 0 <= row["acc"] <= 1 and 0 <= row["mixed"] <= 1, arm
        if "diff" in row:
            assert row["low"] <= row["diff"] <= row["high"], arm
        if "finished" in row:
            assert 0 <= row["finished"] <= 1 and arm.startswith("ada_seq"), arm
    # the text: under this trainer's sparse training Ada-Seq's mixed group is dearer at every pass rate, and the
    # reweighted rule's drift at p = 0.9 is larger without the cap (so the cap does not cause it)
    assert records["cost_model_sparse"]["cheaper_at"] == 0
    assert records["reweight_uncapped"]["0.9"] > 1.3
