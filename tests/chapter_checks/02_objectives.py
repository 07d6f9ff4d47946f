"""Checks on the values recorded by book/02_objectives.ipynb (run in the smoke profile)."""

import math


def check(records):
    assert records["grpo_mc_max_z"] < 5
    assert math.isclose(records["w2_bessel"], 1 / math.sqrt(2), rel_tol=1e-9)   # GRPO with pairs is linear
    for G, w in records["wG_edge_limit"].items():
        G = int(G)
        assert math.isclose(w, (G - 1) / math.sqrt(G), rel_tol=1e-6)           # the finite ceiling
    half = records["wG_half"]
    expected = {"4": 1.3995, "8": 1.7358, "16": 1.8727, "64": 1.9686}
    for G, w in expected.items():
        assert abs(half[G] - w) < 1e-3
    assert all(half[g] < 2 for g in half)
    nv = records["arcsine_nvar"]
    assert abs(nv["n256_p05"] - 1) < 0.01          # stabilised for large n p(1-p)
    assert abs(nv["n8_p001"] - 0.310) < 0.005      # collapses at p << 1/n
    assert abs(nv["n8_p02"] - 1.636) < 0.005       # overshoots at n p ~ 1-2
    # the largest overshoot of n Var over p (closed form, summed over the binomial): the text's 1.82, 2.47, ~1.65
    peak = records["arcsine_nvar_peak"]
    assert abs(peak["4"] - 1.818) < 0.002 and abs(peak["2"] - 2.467) < 0.002
    assert all(abs(peak[n] - 1.65) < 0.01 for n in ("256", "1024"))
    # the share of 2 - w_G(1/2) that Bessel's correction and the shut gate explain: all, 81%, 54%, then half
    share = records["wG_half_bessel_gate_share"]
    assert abs(share["2"] - 1) < 1e-9 and abs(share["4"] - 0.81) < 0.005 and abs(share["8"] - 0.54) < 0.005
    assert abs(share["64"] - 0.5) < 0.001
    # the smoothed log weight's ceilings: w(2/10) 7/8 and w(2/25) 7/8
    ceil = records["smoothed_log_ceilings"]
    assert abs(ceil["Beta(1, 1) smoothing"] - 4.375) < 1e-6
    assert abs(ceil["Beta(1, 16) on the group (hypothetical)"] - 10.9375) < 1e-6
    # the hybrid (Ada-Est's even split) lands on grad J_log up to the rounding of n_i
    assert records["hybrid_check"]["cosine"] > 0.999
    assert records["log_weight_share_below_005"] > 0.7
    assert 6.9 < records["plug_in_log_ceiling"] <= 7 + 1e-9
    # on the models (committed audits, no sampling): the shares and split-half changes the text quotes
    on = records["on_models"]
    quoted = {"tiny model": {"linear": 31.5, "arcsine": 38.9, "power (α = 0.5)": 50.2, "log": 67.3,
                             "GRPO, G = 8 (exact)": 34.5},
              "SmolLM2-135M": {"linear": 49.5, "arcsine": 55.7, "power (α = 0.5)": 68.5, "log": 81.5,
                               "GRPO, G = 8 (exact)": 52.1}}
    for model, shares in quoted.items():
        rows = on[model]["objectives"]
        assert all(abs(100 * rows[o]["share_all_wrong"] - v) < 0.05 for o, v in shares.items()), model
    text = {"tiny model": {"linear": 31, "power (α = 0.5)": 50, "log": 67},  # the whole percentages the text quotes
            "SmolLM2-135M": {"linear": 50, "power (α = 0.5)": 68, "log": 82}}
    for model, shares in text.items():
        rows = on[model]["objectives"]
        assert all(round(100 * rows[o]["share_all_wrong"]) == v for o, v in shares.items()), model
    changes = {"tiny model": (8.0, 22.4), "SmolLM2-135M": (5.3, 14.7)}  # arcsine, log
    for model, (arc, log) in changes.items():
        rows = on[model]["objectives"]
        assert abs(100 * rows["arcsine"]["split_half_rel_diff"] - arc) < 0.05
        assert abs(100 * rows["log"]["split_half_rel_diff"] - log) < 0.05
