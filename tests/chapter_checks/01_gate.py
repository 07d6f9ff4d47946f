"""Checks on the values recorded by book/01_gate.ipynb (run in the smoke profile)."""

import math


def check(records):
    assert records["gate_max_G8"] == 1 - 2 ** -7
    assert math.isclose(records["u_at_Gp1_G8"], 1 - (7 / 8) ** 8 - (1 / 8) ** 8, rel_tol=1e-12)
    assert records["gate_mc_worst_z"] < 5
    # the source's sum, and the corrected expected cost of the 4 -> 32 -> 256 schedule
    assert math.isclose(records["seed_escalation_naive"], 4 * 0.627 + 32 * 0.169 + 256 * 0.017, rel_tol=1e-9)
    assert math.isclose(records["escalation_cost_reuse"], 4 + 0.373 * 28 + 0.204 * 224, rel_tol=1e-9)
    # tiers that start afresh: the coverage read at the tiers is an upper bound; the fitted population's price
    afresh = records["escalation_cost_no_reuse"]
    assert math.isclose(afresh["coverage_upper_bound"], 4 + 0.373 * 32 + 0.204 * 256, rel_tol=1e-9)
    assert abs(afresh["fitted_population"] - 67.51) < 0.01
    assert math.isclose(records["escalation_cost_ratio"], 60.14 / 256, rel_tol=1e-6)
    assert math.isclose(records["never_solved_budget_share"], 0.187 * 256 / 60.14, rel_tol=1e-6)
    fit = records["fit_population"]
    assert abs(fit["pi0"] - 0.186) < 0.002 and abs(fit["a"] - 1.348) < 0.01 and abs(fit["b"] - 1.873) < 0.01
    esc = records["world_escalation"]
    assert abs(esc["simulated"] - esc["predicted"]) < 5 * esc["se"]
    assert abs(esc["simulated_afresh"] - esc["predicted_afresh"]) < 5 * esc["se_afresh"]
    assert esc["predicted_afresh"] > esc["predicted"]
    best = records["best_G"]
    assert best["max_abs_z"] < 5
    assert 1 + math.sqrt(2) - 1e-9 <= best["G_star"] < 6      # G* >= 1 + sqrt(2) always
    assert best["grid_best"] in (2, 3, 4)
    assert 1 + math.sqrt(2) - 1e-9 <= best["G_star_fitted_population"] < 6
    # the text's "about half" and "92% between prompts" (cpu profile; the smoke world is smaller)
    shares = records["rollout_gradient_shares"]
    assert 0.35 < shares["grad_sq_over_pqS"] < 0.65 and 0.8 < shares["between_prompts"] <= 1
    raft = records["raft_all_correct_step"]
    assert 0.5 < raft["min"] <= raft["median"] <= raft["max"] < 4   # ||grad p / p|| is of order 1 - p
    # the gate on the tiny model: the audit's unbiased u_hat predicts the first step's mixed share of the committed
    # runs (the text: within half a standard error, |z| <= 0.39), and the plug-in u(k/n, G) is lower at every G
    model = records["model_gate"]
    assert sorted(model) == ["2", "4", "8"]
    for row in model.values():
        assert abs(row["z"]) < 0.5 and 0 < row["plug_in"] < row["predicted"] < 1
        assert math.isclose(row["z"], (row["measured"] - row["predicted"]) / math.hypot(row["se_measured"], row["se_predicted"]))
    assert abs(model["2"]["predicted"] - 0.239) < 0.001 and abs(model["8"]["measured"] - 0.594) < 0.001
