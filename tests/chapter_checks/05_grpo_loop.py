"""Checks on the values recorded by book/05_grpo_loop.ipynb (run in the smoke profile)."""

import math


def check(records):
    # one step by hand = Trainer.train_step; the trainer's log-probabilities are the sampler's
    w = records["walkthrough"]
    assert w["grad_max_diff"] <= 1e-5 * w["grad_scale"] and w["param_max_diff"] <= 1e-3 * w["lr"]
    assert w["rollouts"] == 128 and w["samples"] == 128
    assert w["nonzero"] == 8 * w["mixed_groups"]
    assert w["logprob_gap"] < 1e-3

    # advantages by exact enumeration: RLOO unbiased, Dr. GRPO (G-1)/G, GRPO = w_G(p) grad p
    a = records["advantages"]
    assert a["rloo_max_err"] < 1e-12 and math.isclose(a["drgrpo_ratio"], 0.75, rel_tol=1e-12)
    assert a["grpo_weight_max_err"] < 1e-12 and a["var_rloo"] < a["var_no_baseline"]

    # the clipped surrogate's gradient: autograd = formula = finite differences; some tokens clipped
    c = records["clip"]
    assert c["grad_err"] < 1e-12 and c["fd_err"] < 1e-6 and 0 < c["clipped"] < c["tokens"]

    # normalisation: the sequence-mean length bias and the token-mean gain from dropping a uniform group
    g = records["aggregation"]
    assert math.isclose(g["length_bias"], 44 / 30, rel_tol=1e-6)
    assert math.isclose(g["filter_gain"], g["T"] / (g["T"] - 37), rel_tol=1e-6)

    # ratio one: the surrogate's gradient is REINFORCE for every normalisation
    assert set(records["reinforce"]) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert all(v < 1e-4 for v in records["reinforce"].values())

    # k3: value = KL(pi || ref), gradient = grad KL(ref || pi), drifting from grad KL(pi || ref) with distance
    kl = records["kl"]
    assert all(r["grad_err_forward"] < 1e-6 for r in kl)
    gaps = [r["rel_gap_reverse"] for r in kl]
    assert all(x < y for x, y in zip(gaps, gaps[1:])) and gaps[0] < 0.1 < gaps[-1]

    # the live run: accounting and, on the machine that made the reference run, identical to it
    live = records["live"]
    assert live["rollouts"] == live["steps"] * 128
    assert live["trained_tokens"] <= live["generated_tokens"]
    assert 0 <= live["acc_before"] <= 1 and 0 <= live["acc_after"] <= 1
    same = live["same_run"]
    if same and same["same_software"]:
        assert same["steps_identical"] == same["steps_compared"]

    # reference runs: whatever seeds exist, each group size trains 128 rollouts per step
    for G, s in records["group_size"].items():
        assert int(G) * s["B"] == 128 and s["seeds"] >= 1
        assert math.isclose(s["nonzero_per_step"], int(G) * s["mixed_per_step"], rel_tol=1e-9)

    gpu = records["gpu_config"]
    assert gpu["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and gpu["group_size"] == 8 and gpu["lr"] == 1e-6
    # the group sizes paired over the committed runs' three seeds, Holm-adjusted across the three comparisons
    pairs = records.get("group_size_paired")
    if pairs:
        assert all(r["seeds"] == [0, 1, 2] and r["p_t"] <= r["p_holm"] <= 1 for r in pairs.values()), pairs
        assert pairs["G = 16 - G = 8"]["p_holm"] > 0.05  # the text: indistinguishable from noise after the adjustment
