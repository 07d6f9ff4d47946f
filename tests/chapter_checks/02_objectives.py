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
    var = records["reweighting_variance"]
    assert set(var) == {"explicit", "reweighted sampling", "allocation"} and all(v > 0 for v in var.values())
    assert records["log_weight_share_below_005"] > 0.7
    assert 6.9 < records["plug_in_log_ceiling"] <= 7 + 1e-9
