"""Bayesian data selection (chapter 9): INSIGHT, MoPPS, expected difficulty, inverse evidence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as sps

from rlcurate.curation import build_curator
from rlcurate.curation.base import Group, StepContext
from rlcurate.curation.sage import SageSampler
from rlcurate.interop import PromptSelection
from rlcurate.curation.selection import (
    ExpectedDifficultySelector,
    InsightSelector,
    InverseEvidenceSelector,
    MoPPSSelector,
    group_evidence,
)
from rlcurate.sim.bridge import SimTrainer
from rlcurate.seeding import stream
from rlcurate.sim.world import SoftmaxWorld
from rlcurate.stats.beliefs import insight_score
from rlcurate.tasks.base import Problem

SELECTORS = ["insight", "mopps", "expected_difficulty", "inverse_evidence"]


def ctx_for(step: int, M: int, K: int = 8, seed: int = 0) -> StepContext:
    return StepContext(step=step, seed=seed, problems=[], task=None, tokenizer=None, engine=None, sampling=None,
                       group_size=K, prompts_per_step=M)


def group(index: int, rewards, hint_level: int = 0, pool=None) -> Group:
    r = np.asarray(rewards, dtype=float)
    g = Group(index=index, problem=Problem(uid=str(index), question="q", answer="a"), prompt="p",
              completions=[None] * r.size, rewards=r, hint_level=hint_level)
    if pool is not None:
        g.pool_successes, g.pool_size = pool
    return g


def random_beliefs(sel, n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    sel.bind(n, seed=0)
    sel.beliefs.alpha = rng.uniform(0.5, 20, n)
    sel.beliefs.beta = rng.uniform(0.5, 20, n)


# ---------------------------------------------------------------------------------------- INSIGHT
def test_insight_picks_exactly_the_top_m_of_its_score_among_the_candidates():
    sel = InsightSelector()
    random_beliefs(sel, 500)
    M, K = 8, 6
    chosen = sel.select(ctx_for(3, M, K=K), M)
    cand = sel.last_candidates
    assert cand.size == 16 * M and np.unique(cand).size == cand.size  # M_hat = 16 M distinct prompts
    score = insight_score(sel.beliefs.alpha[cand], sel.beliefs.beta[cand], K, 3.0, 0.3)
    np.testing.assert_allclose(sel.last_scores, score, rtol=1e-12)
    assert len(chosen) == M and set(chosen) <= set(cand.tolist())
    best = set(cand[np.argsort(-score, kind="stable")[:M]].tolist())
    assert set(chosen) == best
    chosen_scores = score[np.isin(cand, chosen)]
    assert chosen_scores.min() >= score[~np.isin(cand, chosen)].max()


def test_candidates_come_from_the_step_generator_and_ties_are_a_seeded_uniform_choice():
    a, b = InsightSelector(), InsightSelector()
    a.bind(300, 0)
    b.bind(300, 0)
    # all beliefs equal the prior: every candidate ties, the first M of the seeded draw win
    first = a.select(ctx_for(5, 4), 4)
    assert first == a.last_candidates[:4].tolist()
    assert first == b.select(ctx_for(5, 4), 4)  # same run seed and step: same choice
    assert first != a.select(ctx_for(6, 4), 4)  # another step: another draw
    # the choice is not biased to low pool indices
    picks = np.concatenate([a.select(ctx_for(s, 4), 4) for s in range(200)])
    assert 100 < picks.mean() < 200


def test_candidate_set_is_the_whole_pool_when_the_pool_is_small():
    sel = InsightSelector()
    random_beliefs(sel, 40)
    sel.select(ctx_for(0, 4), 4)
    assert sorted(sel.last_candidates.tolist()) == list(range(40))
    with pytest.raises(ValueError, match="distinct prompts"):
        sel.select(ctx_for(0, 41), 41)


# ---------------------------------------------------------------------------------------- beliefs
@pytest.mark.parametrize("discount", [1.0, 0.5])
def test_observe_is_the_conjugate_update_of_the_trained_prompts_only(discount):
    sel = MoPPSSelector(discount=discount, evidence="trained")
    sel.bind(10, 0)
    sel.beliefs.alpha[:] = np.arange(1, 11)
    sel.beliefs.beta[:] = 2.0
    a0, b0 = sel.beliefs.alpha.copy(), sel.beliefs.beta.copy()
    groups = [group(2, [1, 0, 1, 1]),              # S = 3 of 4
              group(5, [0, 0, 0, 0, 0, 0]),        # S = 0 of 6
              group(7, [1, 0.1, 0, 1]),            # graded: only rewards >= 1 are successes, S = 2
              group(8, [0, 0, 0, 0], hint_level=2),             # hinted, no pool: not evidence
              group(9, [1, 1, 1, 1], hint_level=1, pool=(0, 4))]  # hinted, unhinted pool 0 of 4
    sel.observe(ctx_for(0, 4), groups)
    lam = discount
    expect = {2: (3, 4), 5: (0, 6), 7: (2, 4), 9: (0, 4)}
    for i in range(10):
        if i in expect:
            S, K = expect[i]
            assert sel.beliefs.alpha[i] == pytest.approx(lam * a0[i] + (1 - lam) * 1.0 + S)
            assert sel.beliefs.beta[i] == pytest.approx(lam * b0[i] + (1 - lam) * 1.0 + K - S)
        else:
            assert sel.beliefs.alpha[i] == a0[i] and sel.beliefs.beta[i] == b0[i]


def test_generated_evidence_counts_every_unhinted_group_of_the_step_once_per_prompt():
    sel = InsightSelector(discount=0.5, evidence="generated")
    sel.bind(6, 0)
    sel.beliefs.alpha[:] = 3.0
    ctx = ctx_for(0, 2)
    ctx.generated_groups = [group(1, [1, 0, 0, 0]), group(1, [1, 1, 0, 0]),  # two rounds of prompt 1
                            group(2, [0, 0, 0, 0]),                          # discarded later
                            group(3, [1, 1, 1, 1], hint_level=2)]            # hinted: not evidence
    sel.observe(ctx, [group(1, [1, 1, 0, 0])])  # what was trained does not matter here
    assert sel.beliefs.alpha[1] == pytest.approx(0.5 * 3 + 0.5 + 3) and sel.beliefs.beta[1] == pytest.approx(1 + 5)
    assert sel.beliefs.alpha[2] == pytest.approx(0.5 * 3 + 0.5) and sel.beliefs.beta[2] == pytest.approx(1 + 4)
    assert sel.beliefs.alpha[3] == 3.0 and sel.beliefs.beta[3] == 1.0


def test_group_evidence_prefers_pool_statistics():
    assert group_evidence(group(0, [1, 0], pool=(5, 16))) == (5.0, 16.0)
    assert group_evidence(group(0, [1, 0, 1])) == (2.0, 3.0)
    assert group_evidence(group(0, [1, 0], hint_level=1)) is None
    # a hinted group's failures, and only they, with hinted_evidence="failures"
    assert group_evidence(group(0, [1, 0, 0], hint_level=2), hinted_evidence="failures") == (0.0, 2.0)
    assert group_evidence(group(0, [1, 0], pool=(5, 16), hint_level=1), hinted_evidence="failures") == (5.0, 16.0)


@pytest.mark.parametrize("evidence", ["generated", "trained"])
def test_hinted_failures_move_the_belief_down_and_skip_leaves_it(evidence):
    for hinted, expect in (("skip", (1.0, 1.0)), ("failures", (1.0, 4.0))):
        sel = InsightSelector(evidence=evidence, hinted_evidence=hinted)
        sel.bind(4, seed=0)
        ctx = ctx_for(0, M=1)
        g = group(2, [1, 0, 0, 0], hint_level=1)
        ctx.generated_groups = [g]
        sel.observe(ctx, [g])
        assert (sel.beliefs.alpha[2], sel.beliefs.beta[2]) == expect, (evidence, hinted)
    with pytest.raises(ValueError, match="hinted_evidence"):
        InsightSelector(hinted_evidence="all")


def _late_choices(strategy: str, seed: int, steps: int = 40, **kw) -> set[int]:
    """The prompts chosen in the second half of a run on a small simulated pool whose hints do not help."""
    world = SoftmaxWorld.make(n_prompts=80, pass_rate_beta=(0.5, 0.5), hint_strength=0.0, seed=seed)
    trainer = SimTrainer(world, build_curator(strategy, **kw), prompts_per_step=8, group_size=8, seed=seed)
    trainer.run(steps)
    return {i for ids in trainer.sampled_prompts[steps // 2:] for i in ids}


def test_a_selector_with_sage_light_is_trapped_by_hints_that_fail_unless_their_failures_count():
    """Appendix A3: with hinted groups skipped, a hinted prompt's belief never moves, so INSIGHT chooses
    the same failing prompts step after step; counting hinted failures gives back INSIGHT's spread."""
    seeds = range(4)
    alone = np.mean([len(_late_choices("insight", s)) for s in seeds])
    skip = np.mean([len(_late_choices("insight+sage_light", s)) for s in seeds])
    failures = np.mean([len(_late_choices("insight+sage_light", s, hinted_evidence="failures")) for s in seeds])
    assert skip < 0.7 * alone, (skip, alone)
    assert failures > 0.9 * alone, (failures, alone)


# ---------------------------------------------------------------------------------------- MoPPS
def test_mopps_selection_distribution_matches_the_thompson_probabilities():
    """P(prompt i selected) = P(|phi_hat_i - 1/2| is the smallest), phi_hat_k ~ Beta(a_k, b_k)."""
    ab = [(2.0, 8.0), (5.0, 5.0), (20.0, 2.0), (1.0, 1.0)]
    sel = MoPPSSelector()
    sel.bind(len(ab), 0)  # candidate set = the whole pool
    sel.beliefs.alpha = np.array([a for a, _ in ab])
    sel.beliefs.beta = np.array([b for _, b in ab])
    dists = [sps.beta(a, b) for a, b in ab]

    def p_within(k, d):  # P(|phi_k - 1/2| <= d)
        return dists[k].cdf(0.5 + d) - dists[k].cdf(0.5 - d)

    exact = []
    for i in range(len(ab)):
        dens = lambda d: (dists[i].pdf(0.5 + d) + dists[i].pdf(0.5 - d)) * np.prod(
            [1 - p_within(k, d) for k in range(len(ab)) if k != i])
        exact.append(integrate.quad(dens, 0, 0.5, limit=200)[0])
    exact = np.array(exact)
    assert exact.sum() == pytest.approx(1.0, abs=1e-6)
    N = 4000
    counts = np.bincount([sel.select(ctx_for(s, 1), 1)[0] for s in range(N)], minlength=len(ab))
    freq = counts / N
    tol = 4 * np.sqrt(exact * (1 - exact) / N) + 1e-3
    assert np.all(np.abs(freq - exact) < tol), (freq, exact)


# ---------------------------------------------------------------------------------------- baselines
def test_expected_difficulty_and_inverse_evidence_rules():
    ed = ExpectedDifficultySelector()
    random_beliefs(ed, 400)
    chosen = ed.select(ctx_for(0, 5), 5)
    cand = ed.last_candidates
    dist = np.abs(ed.beliefs.mean[cand] - 0.5)
    assert sorted(np.abs(ed.beliefs.mean[chosen] - 0.5)) == pytest.approx(np.sort(dist)[:5])
    ie = InverseEvidenceSelector()
    random_beliefs(ie, 400)
    chosen = ie.select(ctx_for(0, 5), 5)
    ev = ie.beliefs.evidence[ie.last_candidates]
    assert sorted(ie.beliefs.evidence[chosen]) == pytest.approx(np.sort(ev)[:5])


def test_more_during_a_step_extends_the_selection_without_repeats():
    sel = InsightSelector()
    random_beliefs(sel, 60)
    ctx = ctx_for(0, 4)
    first = sel.select(ctx, 4)
    more = sel.more(ctx, 6)
    assert len(more) == 6 and not set(first) & set(more)
    scores = dict(zip(sel.last_candidates.tolist(), sel.last_scores.tolist()))  # chosen by the rule: the best
    assert sorted((scores[i] for i in more), reverse=True) == sorted(scores.values(), reverse=True)[:6]


def test_a_step_that_takes_the_whole_pool_starts_a_new_pass():
    """DAPO's top-ups on a pool that one step exhausts: the rest of the pool first, then the best of the others by
    the rule (as uniform's draw moves to its next epoch), where it raised "cannot select" mid-run."""
    sel = InsightSelector()
    random_beliefs(sel, 6)
    ctx = ctx_for(0, 2)
    taken = sel.select(ctx, 2) + sel.more(ctx, 2)
    last = sel.more(ctx, 3)
    assert len(last) == 3 and len(set(last)) == 3
    rest = set(range(6)) - set(taken)
    assert rest < set(last)  # both untaken prompts, then one of this step's again
    assert not set(sel.more(ctx, 3)) & set(last)  # the new pass goes on without repeats
    world = SoftmaxWorld.make(n_prompts=12, pass_rate_beta=(0.3, 0.3), seed=0)  # mostly unmixed: DAPO refills
    res = SimTrainer(world, build_curator("insight+dapo"), prompts_per_step=8, group_size=8, seed=0).run(3)
    assert max(res.column("rollouts")) > 12 * 8  # a step generated more groups than the pool has prompts


@pytest.mark.parametrize("seed", [8, 9, 28, 32])  # seeds where the pass left untaken prompts in skipped tails
def test_mopps_top_ups_reach_every_untaken_prompt_of_its_pass(seed):
    """MoPPS's candidates are chunks of a shuffled pass; a chunk that would run past the pass's end starts a new
    pass, skipping the old pass's tail. DAPO's top-ups late in a step then found fewer untaken prompts than they
    asked for ("cannot select 1 distinct prompts from a pool of 0" with 3 of 100 untaken); now the untaken rest is
    always among the candidates, and a step repeats no prompt until it has taken them all."""
    sel = PromptSelection("mopps", 100, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        step = sel.select(32)
        for _ in range(12):
            more = sel.more(int(rng.integers(1, 12)))
            fresh = 100 - len(step)
            assert not set(more[:fresh]) & set(step) and len(set(more)) == len(more)
            step = more[fresh:] if len(more) > fresh else step + more
        sel.observe([], [])


@pytest.mark.parametrize("evidence", ["generated", "trained"])
def test_a_host_that_says_which_rows_it_trained_feeds_the_evidence_rule(evidence):
    """PromptSelection.observe(..., trained_rows=): evidence="trained" counts the trained rows only, "generated"
    every row; every row trained is the same as not saying (pool statistics included)."""
    ids = [0] * 4 + [1] * 4 + [2] * 4
    rewards = [1, 0, 1, 1] + [0, 0, 0, 0] + [1, 0, 0, 0]
    trained = [True] * 4 + [False] * 4 + [True, True, False, False]
    sel = PromptSelection("insight", 5, group_size=4, evidence=evidence)
    sel.observe(ids, rewards, trained_rows=trained)
    b = sel.selector.beliefs
    if evidence == "trained":
        assert (b.alpha - 1).tolist()[:3] == [3, 0, 1] and (b.beta - 1).tolist()[:3] == [1, 0, 1]
    else:
        assert (b.alpha - 1).tolist()[:3] == [3, 0, 1] and (b.beta - 1).tolist()[:3] == [1, 4, 3]
    pools = dict(pool_successes=[5.0] * 4 + [0.0] * 8, pool_sizes=[8] * 4 + [0] * 8)
    said, unsaid = (PromptSelection("insight", 5, group_size=4, evidence=evidence) for _ in range(2))
    said.observe(ids, rewards, **pools, trained_rows=[True] * 12)
    unsaid.observe(ids, rewards, **pools)
    assert said.selector.beliefs.alpha.tolist() == unsaid.selector.beliefs.alpha.tolist()
    assert said.selector.beliefs.beta.tolist() == unsaid.selector.beliefs.beta.tolist()


def test_compositions_use_the_belief_selector():
    cur = build_curator("insight+sage")
    assert isinstance(cur.selector, InsightSelector) and isinstance(cur.sampler, SageSampler)
    cur = build_curator("mopps", discount=0.5, candidate_factor=8)
    assert cur.selector.discount == 0.5 and cur.selector.candidate_factor == 8


# ---------------------------------------------------------------------------------------- simulated world
def run_sim(name, world, steps, seed, **kw):
    tr = SimTrainer(world, build_curator(name, **kw), prompts_per_step=8, group_size=8, seed=seed)
    return tr, tr.run(steps)


@pytest.mark.parametrize("name", SELECTORS)
def test_state_round_trip_reproduces_the_run(name):
    world = SoftmaxWorld.make(n_prompts=128, pass_rate_beta=(0.3, 0.3), seed=3)
    _, full = run_sim(name, world, 10, seed=1)
    first, part1 = run_sim(name, world, 5, seed=1)
    state = json.loads(json.dumps(first.curator.state_dict()))  # checkpoints store it as JSON
    again = SimTrainer(world, build_curator(name), prompts_per_step=8, group_size=8, seed=1, theta=first.theta)
    again.curator.load_state_dict(state)
    again.step, again.rollouts = first.step, first.rollouts
    part2 = again.run(5)
    assert part1.records[1:] + part2.records[1:] == full.records[1:]
    assert np.array_equal(again.theta, full.theta)


@pytest.mark.parametrize("name", ["insight", "mopps"])
def test_belief_selection_raises_the_effective_prompt_ratio_on_a_saturated_world(name):
    """With Beta(0.3, 0.3) initial pass rates most prompts sit near 0 or 1; uniform sampling wastes
    most groups, belief selection learns to avoid them (3 seeds, 60 steps each)."""
    def ratio(strategy):
        out = []
        for seed in range(3):
            world = SoftmaxWorld.make(pass_rate_beta=(0.3, 0.3), seed=seed)
            _, res = run_sim(strategy, world, 60, seed)
            out.append(np.mean(res.column("effective_prompt_ratio")[1:]))
        return float(np.mean(out))

    base, ours = ratio("uniform"), ratio(name)
    assert ours > base + 0.1, (name, ours, base)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The smoke runs use one torch thread (``threads=1``: far faster on a busy 2-core machine);
    give the rest of the session its thread count back."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_generated_evidence_keeps_insight_with_dapo_from_reselecting_discarded_prompts():
    """DAPO discards uniform groups; beliefs fed only the trained (mixed) groups never learn that a
    saturated prompt is saturated, so INSIGHT keeps choosing it and DAPO keeps discarding it."""
    import logging

    logging.disable(logging.WARNING)
    try:
        out = {}
        for evidence in ["trained", "generated"]:
            eff, rollouts = [], []
            for seed in range(2):
                world = SoftmaxWorld.make(pass_rate_beta=(0.3, 0.3), seed=seed)
                cur = build_curator("insight+dapo", insight={"evidence": evidence}, dapo={})
                res = SimTrainer(world, cur, prompts_per_step=8, group_size=8, seed=seed).run(40)
                eff.append(np.mean(res.column("effective_prompt_ratio")[1:]))
                rollouts.append(res.records[-1]["total_rollouts"])
            out[evidence] = (np.mean(eff), np.mean(rollouts))
    finally:
        logging.disable(logging.NOTSET)
    assert out["generated"][0] > out["trained"][0] + 0.2, out
    assert out["generated"][1] < out["trained"][1], out


# ---------------------------------------------------------------------------------------- tiny model
def tiny_policy():
    path = Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread"
    if (path / "config.json").is_file():
        from rlcurate.models import load_policy

        return load_policy(str(path), device="cpu", dtype="fp32")
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

    return build_tiny_model(seed=0), build_tiny_tokenizer()


@pytest.mark.parametrize("name", SELECTORS)
def test_trainer_smoke(name, tmp_path):
    from rlcurate.tasks.arithmetic import ArithmeticTask
    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    model, tok = tiny_policy()
    cfg = TrainConfig(strategy=name, steps=2, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=0,
                      out_dir=str(tmp_path), progress=False, save_model=False, threads=1)
    tr = Trainer(cfg, model=model, tokenizer=tok, task=ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8))
    tr.run()
    recs = [r for r in tr.metrics.read() if "rollouts" in r]
    assert [r["rollouts"] for r in recs] == [16, 16]
    b = tr.curator.selector.beliefs
    # beliefs hold exactly the evidence of the trained groups: 2 steps x 4 prompts x 4 rollouts
    assert float((b.alpha + b.beta - 2.0).sum()) == pytest.approx(32.0)
    assert int(((b.alpha + b.beta) > 2.0).sum()) <= 8
    saved = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["curator"]["selector"]["beliefs"]
    assert saved["alpha"] == b.alpha.tolist()


def test_order_offset_gives_the_curator_stream_its_own_draws_in_the_sim_and_the_trainer(tmp_path):
    """The A/A control's other arm (``order_offset``) draws the curator's stream ``ctx.rng`` afresh (MoPPS's and
    INSIGHT's candidates and Thompson draws, Pilot-Commit's pilots come from it), as the config promises, while
    generation keeps the run seed's streams."""
    from rlcurate.tasks.arithmetic import ArithmeticTask
    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    world = SoftmaxWorld.make(n_prompts=200, seed=3)
    sims = {off: SimTrainer(world, build_curator("mopps"), prompts_per_step=8, group_size=8, seed=0, order_offset=off)
            for off in (0, 1000)}
    model, tok = tiny_policy()
    task = ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8)
    cfg = TrainConfig(strategy="mopps", steps=1, prompts_per_step=4, group_size=4, progress=False, save_model=False,
                      threads=1).to_dict()
    lms = {off: Trainer(TrainConfig.from_dict({**cfg, "order_offset": off, "out_dir": str(tmp_path / str(off))}),
                        model=model, tokenizer=tok, task=task) for off in (0, 1000)}
    for ctx0, ctx1 in ((sims[0].context(), sims[1000].context()), (lms[0].context(0), lms[1000].context(0))):
        a, b = ctx0.rng.random(4).tolist(), ctx1.rng.random(4).tolist()
        assert a == stream("curator", 0, 0).random(4).tolist() and b == stream("curator", 1000, 0).random(4).tolist()
        assert ctx0._seed == ctx1._seed == 0  # the sampling streams stay the run seed's
