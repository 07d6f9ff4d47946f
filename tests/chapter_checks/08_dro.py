"""Checks on the values recorded by book/08_dro.ipynb (run in the smoke profile)."""


def check(records):
    sc = records["statistic_checks"]
    assert sc["max_err"] < 1e-4                 # the scoring pass equals a direct forward pass
    assert sc["same_reasoning_max_sigma"] == 0  # one shared reasoning: no spread at all
    assert sc["sigma_disagree"] > sc["sigma_agree"]
    r3 = records["r3_vs_verifier"]
    assert r3["auc_pooled"] > 0.9 and r3["n_rollouts"] == records["n_prompts"] * 8
    roles = records["sigma_by_role"]
    # the delimiter after a finished scratchpad is (nearly) certain; the digits carry the spread
    assert roles["#"]["mean_sigma"] < roles["middle"]["mean_sigma"]
    gm = records["gradient_mass"]
    for w in (gm["DRO_weights"], gm["uniform"]):
        assert abs(sum(w.values()) - 1) < 1e-6
    # the same rollouts at step 1 in the three live runs: the same pass rate and generated tokens
    firsts = {(v["first_reward_mean"], v["first_generated_tokens"]) for v in records["live"].values()}
    assert len(firsts) == 1, firsts
