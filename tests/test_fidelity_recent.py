"""Fidelity of chapter 11's recent methods to their official code (issue #27): Knapsack-RL
(``liziniu/KnapsackRL``), GRESO (``Infini-AI-Lab/GRESO``) and Pilot-Commit (``databricks/pilot-commit``).

The Knapsack-RL vectors were executed against a scratch copy of the official ``exploration_utils.py``
(``data/specs/greso_knapsack.md`` B.8). The GRESO and Pilot-Commit rules are restated below from their
files (``official_*``, with the file and lines they come from) and fed the same inputs as the strategies;
their vectors come from reading the code (specs A.8 and ``data/specs/pilot_commit.md`` section 7). Then each
strategy runs in the simulated world: what it generates is charged, what it trains is what its paper
trains, and a resumed run continues exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlcurate.curation import build_curator
from rlcurate.curation.base import Group, group_advantages
from rlcurate.curation.greso import adapt, next_batch_size, skip_probability
from rlcurate.curation.knapsack import knapsack_allocation, knapsack_value, rollouts_needed
from rlcurate.curation.pilot_commit import pilot_decision, stale
from rlcurate.errors import UserError
from rlcurate.sim import SoftmaxWorld
from rlcurate.sim.bridge import SimTrainer

# ------------------------------------------------------------------------------------------ Knapsack-RL
VALUES = [((8, 0.5), 0.1240234375), ((2, 0.5), 0.0625), ((4, 0.25), 0.0955810546875), ((8, 0.125), 0.0628187),
          ((32, 0.125), 0.0943690), ((8, 0.9), 0.0051258), ((8, 0.0), 0.0), ((8, 1.0), 0.0)]


@pytest.mark.parametrize("args, expected", VALUES)
def test_knapsack_value_is_the_published_function(args, expected):
    assert knapsack_value(*args) == pytest.approx(expected, abs=5e-8)


@pytest.mark.parametrize("p, cost", [(0.5, 3), (0.25, 8), (0.9, 21), (0.1, 21), (0.05, 44)])
def test_knapsack_fallback_cost_truncates_like_the_official_code(p, cost):
    assert int(min(128, rollouts_needed(p))) == cost


# rows [validity, p_hat] -> allocation, executed against the official sampling_budget_by_knapsack (B.8)
ALLOCATIONS = {
    "first epoch": ([0, 0, 0, 0], [0, 0, 0, 0], {}, [8, 8, 8, 8]),
    "fallback": ([1, 1, 1, 1], [0, 1, .5, .5], {}, [20, 2, 5, 5]),
    "no fallback": ([1, 1, 1, 1], [0, 1, .5, .5], {"allow_fallback": False}, [2, 2, 14, 14]),
    "fallback not needed": ([1, 1, 1, 1], [.5, .125, .875, .25], {}, [6, 13, 3, 10]),
    "all effective": ([1, 1, 1, 1], [.1, .2, .3, .4], {}, [9, 9, 8, 6]),
    "only 0 and 1": ([1, 1, 1, 1], [0, 1, 1, 0], {}, [14, 2, 2, 14]),
    "all solved": ([1, 1, 1, 1], [1, 1, 1, 1], {}, [8, 8, 8, 8]),
    "unseen absorbs fallback": ([0, 1, 1, 1], [0, 0, .5, 1], {}, [16, 9, 5, 2]),
    "tiny budget": ([1, 1, 1, 1], [.5, .5, .1, .9], {"total": 10}, [3, 3, 2, 2]),
    "odd budget tie-break": ([1, 1], [.5, .5], {"total": 9, "allow_fallback": False}, [5, 4]),
    "hard vs mid": ([1, 1], [.5, .05], {"total": 40}, [9, 31]),
    "soft max_n": ([1, 1, 1, 1], [.5, .5, 1, 1], {"max_n": 4, "allow_fallback": False}, [14, 14, 2, 2]),
}


@pytest.mark.parametrize("case", list(ALLOCATIONS))
def test_knapsack_allocation_equals_the_official_code(case):
    valid, p, kw, expected = ALLOCATIONS[case]
    assert knapsack_allocation(valid, p, **kw).tolist() == expected


def test_knapsack_where_the_official_code_crashes_the_programme_keeps_the_budget():
    """Every prompt effective and the fallback without a candidate: the official code divides by zero
    (B.6); here the excess stays with the programme, so the total is still uniform's."""
    n = knapsack_allocation([1] * 4, [0.5] * 4)
    assert n.sum() == 32 and n.min() >= 2 and n.tolist() == [8, 8, 8, 8]


def test_knapsack_estimate_reads_the_last_visit_or_the_16_latest_rewards():
    cur = build_curator("knapsack")
    s = cur.sampler
    assert s.estimate(0) == (False, 0.0)
    s.history[0] = [[1.0] * 4]
    assert s.estimate(0) == (False, 0.0)  # 4 < min_buffer_length rollouts of history
    s.history[0] = [[1.0] * 8, [0.0] * 4]
    assert s.estimate(0) == (True, pytest.approx(8 / 12))
    s.history[0] = [[1.0] * 20, [0.0] * 10, [1.0] * 10]
    assert s.estimate(0) == (True, pytest.approx((6 * 0 + 10 * 1) / 16))
    s.history[0] = [[0.0] * 16, [1.0] * 16]
    assert s.estimate(0) == (True, 1.0)  # the last visit alone has 16


# ------------------------------------------------------------------------------------------------ GRESO
def official_greso_skip(trace, p_easy, p_hard):
    """``verl/trainer/ttis/presampling_selector.py:102-147`` (easy then hard probabilistic skip) on a
    trace of per-visit mean rewards: the probability that the prompt is skipped."""
    if not trace:
        return 0.0
    c_e = 0
    for r in reversed(trace):
        if r < 0.98:
            break
        c_e += 1
    s_e = 1 - max(p_easy ** c_e, 0.01) if c_e else 0.0
    if trace[-1] > 0.11:
        return s_e
    c_h = 0
    for r in reversed(trace):
        if r > 0.11:
            break
        c_h += 1
    s_h = 1 - max(p_hard ** c_h, 0.01)
    return s_e + (1 - s_e) * s_h


def runs_of(trace):
    """The strategy's state after binary visits with these means: (all-right run, all-wrong run)."""
    e = h = 0
    for r in trace:
        e, h = (e + 1 if r == 1.0 else 0), (h + 1 if r == 0.0 else 0)
    return e, h


# traces of binary visits of 8 rollouts (spec A.8, the 0.1 rewards translated to 0)
TRACES = [([], .5, .5, 0.0), ([1.0], .5, .5, 0.5), ([1.0, 1.0, 1.0], .5, .5, 0.875), ([.5, 1.0, 1.0], .5, .5, 0.75),
          ([1.0, .5], .5, .5, 0.0), ([0.0] * 7, .5, .5, 0.99), ([0.0, 0.0, 0.0], .5, .4, 0.936), ([1.0], .05, .5, 0.95),
          ([1.0, 1.0], .9, .5, 0.19), ([.125, 0.0], .5, .5, 0.5), ([0.0, .375, 0.0], .5, .5, 0.5)]


@pytest.mark.parametrize("trace, p_easy, p_hard, expected", TRACES)
def test_greso_skip_probability_equals_the_official_rule(trace, p_easy, p_hard, expected):
    ours = skip_probability(*runs_of(trace), p_easy, p_hard)
    assert ours == pytest.approx(official_greso_skip(trace, p_easy, p_hard), abs=1e-12)
    assert ours == pytest.approx(expected, abs=1e-12)


def test_greso_adaptation_and_adaptive_batch_match_the_spec_vectors():
    assert adapt(0.5, 0.10, 0.25 / 3) == pytest.approx(0.49)  # too many all-right groups: skip more
    assert adapt(0.5, 0.10, 2 * 0.25 / 3) == pytest.approx(0.51)
    assert adapt(0.05, 0.5, 0.25 / 3) == 0.05 and adapt(0.95, 0.0, 2 * 0.25 / 3) == 0.95
    # (responses kept, zvr) -> next rollout prompts, last? with n = 8, 2048 wanted, default 384, floor 64
    for kept, zvr, size, last in [(1000, .6, 384, False), (1600, .5, 140, True), (2000, .5, 64, True),
                                  (0, .5, 384, False)]:
        assert next_batch_size(2048 - kept, zvr, 8, 384, 64) == (size, last)
    assert next_batch_size(100, 1.0, 8, 384, 64) == (384, False)  # the official code divides by zero here


def test_greso_does_not_adapt_in_the_first_pass_and_learns_from_every_generated_group():
    world = SoftmaxWorld.make(n_prompts=300, pass_rate_beta=(0.3, 0.3), seed=2)
    tr = SimTrainer(world, build_curator("greso"), prompts_per_step=8, group_size=8, seed=0, test_fraction=0.2)
    sel = tr.curator.selector
    rec = tr.train_step()
    assert sel.epoch == 0 and (sel.p_easy, sel.p_hard) == (0.5, 0.5)
    generated = rec["rollouts"] // 8
    assert len(sel.runs) == generated > rec["kept_samples"] // 8  # zero-variance groups enter the history too
    assert sum(e > 0 for e, _ in sel.runs.values()) and sum(h > 0 for _, h in sel.runs.values())
    while sel.epoch == 0:
        tr.train_step()
    skipped = dict(sel.skipped)
    assert skipped["easy"] + skipped["hard"] > 0
    before = (sel.p_easy, sel.p_hard)
    tr.train_step()
    assert (sel.p_easy, sel.p_hard) != before and all(abs(a - b) == pytest.approx(0.01) for a, b in
                                                      zip((sel.p_easy, sel.p_hard), before))


# ----------------------------------------------------------------------------------------- Pilot-Commit
def official_pc_filter(p_hat, lo, up, ex):
    """``recipe/pc/pc_ray_trainer.py:312-352``: (decision, excluded from later epochs)."""
    if p_hat > 1 - up:
        d = "skip"
    elif p_hat < lo:
        d = "defer"
    else:
        d = "commit"
    return d, ex is not None and p_hat >= ex


@pytest.mark.parametrize("n_p, lo, up, ex, table", [
    (16, .125, .25, 1.0, {0: "defer", 1: "defer", 2: "commit", 8: "commit", 12: "commit", 13: "skip", 15: "skip",
                          16: "skip"}),
    (32, .125, .25, 1.0, {**{k: "defer" for k in range(4)}, **{k: "commit" for k in range(4, 25)},
                          **{k: "skip" for k in range(25, 33)}}),
    (8, .25, .25, None, {0: "defer", 1: "defer", **{k: "commit" for k in range(2, 7)}, 7: "skip", 8: "skip"}),
])
def test_pilot_decision_equals_the_official_filter(n_p, lo, up, ex, table):
    for k, expected in table.items():
        assert pilot_decision(k / n_p, lo, up) == official_pc_filter(k / n_p, lo, up, ex)[0] == expected
    assert official_pc_filter(1.0, lo, up, ex)[1] == (ex is not None)


def test_pilot_commit_buffer_staleness_and_max_variance_order():
    assert not stale(10, 14, 4) and stale(10, 15, 4) and not stale(11, 15, 4)  # spec 7.5
    cur = build_curator("pilot_commit", buffer_sampling="max_variance")
    s = cur.sampler

    def pilot(i, k, n=8):
        return Group(i, None, "x", [None] * n, np.array([1.0] * k + [0.0] * (n - k)))

    s.buffer = {0: (pilot(0, 4), 3), 1: (pilot(1, 1), 5), 3: (pilot(3, 4), 5)}  # A, B, D of spec 7.6
    assert s.take(None, 2) == [3, 0]
    assert sorted(s.take(None, 5)) == [0, 1, 3]


@pytest.mark.parametrize("pilot_right, commit_right, right, wrong", [(6, 30, 0.8749991, -1.1249989),
                                                                      (2, 10, 2.0653363, -0.4766161)])
def test_pilot_commit_trains_pilots_and_commits_as_one_group_like_verl(pilot_right, commit_right, right, wrong):
    """Spec 7.7: 16 pilots and 48 commits, one GRPO group; verl's advantage on rewards +-1 with the unbiased
    std, here on rewards 0/1 (the standardised advantage is the same up to eps)."""
    r = np.array([1.0] * pilot_right + [0.0] * (16 - pilot_right) + [1.0] * commit_right + [0.0] * (48 - commit_right))
    a = group_advantages(Group(0, None, "x", [None] * 64, r), "grpo", 1e-6)
    assert a[0] == pytest.approx(right, rel=2e-6) and a[-1] == pytest.approx(wrong, rel=2e-6)


def test_pilot_commit_rounds_charge_every_pilot_and_train_what_the_paper_trains():
    world = SoftmaxWorld.make(n_prompts=400, seed=4)
    cur = build_curator("pilot_commit", n_pilot=4, n_commit=12)
    tr = SimTrainer(world, cur, prompts_per_step=8, group_size=8, seed=0, test_fraction=0.2)
    s = cur.sampler
    assert s.trained_prompts(tr.context()) == 4 and s.pilots_per_round(tr.context()) == 12
    first = tr.train_step()
    # the buffer is empty at the first step: round 1 only pilots, commits start in round 2
    assert first["curation/pc_rounds"] >= 2
    assert first["rollouts"] == first["curation/pc_rounds"] * 12 * 4 + first["curation/pc_committed"] * 12
    for _ in range(6):
        rec = tr.train_step()
        trained = rec["kept_samples"] // 16
        assert trained == rec["curation/pc_committed"] <= 4 and rec["curation/pc_rounds"] >= 1
        assert rec["rollouts"] == rec["curation/pc_rounds"] * 12 * 4 + trained * 12  # pilots of all, commits
    assert all(0.125 <= float(np.mean(g.rewards[:4] >= 1)) <= 0.75 for g, _ in s.buffer.values())


def test_pilot_commit_leaves_a_prompt_whose_pilots_were_all_right_out_of_later_passes():
    world = SoftmaxWorld.make(n_prompts=120, pass_rate_beta=(3.0, 0.5), seed=5)
    tr = SimTrainer(world, build_curator("pilot_commit", n_pilot=4, n_commit=4), prompts_per_step=4, group_size=8,
                    seed=0, test_fraction=0.2)
    sel = tr.curator.selector
    while sel.epoch < 2:
        tr.train_step()
    assert sel.excluded  # marked in the first pass, left out from the second
    order = sel._epoch_order()
    assert len(order) == sel.n_items - len(sel.excluded) and not set(order.tolist()) & sel.excluded


# ------------------------------------------------------------------------------------------ all three
@pytest.mark.parametrize("name, kw", [("knapsack", {}), ("greso", {}), ("pilot_commit", {"n_pilot": 4, "n_commit": 4})])
def test_recent_methods_resume_exactly(name, kw, resume_identical):
    world = SoftmaxWorld.make(n_prompts=150, pass_rate_beta=(0.5, 0.5), seed=6)
    resume_identical(world, lambda: build_curator(name, **kw), steps=12, split=6, prompts_per_step=8,
                     group_size=8, seed=1, test_fraction=0.2)


@pytest.mark.parametrize("name", ["knapsack", "greso", "pilot_commit"])
def test_bad_options_name_the_option(name):
    # every build_curator error repeats the input first, so the match must be on the message proper
    bad, message = {
        "knapsack": ({"min_n": 0}, r"min_n must be an integer >= 1, got 0$"),
        "greso": ({"p_easy": 2.0}, r"p_easy must lie in \[0, 1\], got 2\.0$"),
        "pilot_commit": ({"buffer_sampling": "newest"},
                         r"buffer_sampling must be one of random, max_variance, got 'newest'$"),
    }[name]
    with pytest.raises(UserError, match=message):
        build_curator(name, **bad)
