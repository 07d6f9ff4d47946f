"""Oracle arms (chapter 11): the expected signal they rank by, what they pick and allocate, and that the
pass rates they know cost nothing charged, in the simulated world and on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlcurate.curation import build_curator
from rlcurate.curation.base import StepContext
from rlcurate.curation.oracle import expected_signal
from rlcurate.errors import UserError
from rlcurate.sim import SoftmaxWorld
from rlcurate.sim.bridge import SimTrainer
from rlcurate.stats.allocation import optimal_allocation


def test_expected_signal_is_the_size_of_the_expected_grpo_update():
    """s(p, G) = w_G(p) sqrt(p (1 - p)): zero at p = 0 and 1, symmetric, and in the simulated world the
    Monte Carlo mean of a GRPO group's update is w_G(p) grad p with |grad p| <= sqrt(p (1 - p)) * score norm."""
    p = np.array([0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0])
    s = expected_signal(p, 8)
    assert s[0] == 0 and s[-1] == 0 and np.allclose(s, s[::-1]) and s.argmax() == 3
    assert expected_signal(0.05, 16) > expected_signal(0.05, 4)  # a bigger group opens a rare prompt's gate

    world = SoftmaxWorld.make(n_prompts=4, seed=3, pass_rates=[0.1, 0.3, 0.5, 0.9])
    theta, rng, G = world.init_theta(), np.random.default_rng(0), 8
    from rlcurate.stats.advantages import standardised
    from rlcurate.stats.objectives import grpo_effective_weight

    for i in range(4):
        groups = world.sample(theta, np.full(20000, i), G, rng)
        r = groups.reward.reshape(-1, G)
        A = np.stack([standardised(row, ddof=1) for row in r])
        scores = world.score(theta, groups.prompt, groups.action).reshape(-1, G, world.dim)
        mean_update = (A[:, :, None] * scores).mean(axis=(0, 1))
        grad_p = world.grad_pass_rates(theta, i)[0]
        expected = grpo_effective_weight(world.pass_rates(theta, i)[0], G, ddof=1) * grad_p
        assert np.linalg.norm(mean_update - expected) < 0.05 * np.linalg.norm(expected) + 2e-3
        p_i = world.pass_rates(theta, i)[0]
        assert np.linalg.norm(grad_p) <= np.sqrt(p_i * (1 - p_i) * world.score_sq_norm(theta, i)[0]) + 1e-12


def test_oracle_select_picks_the_largest_signal_and_is_free_in_the_sim():
    world = SoftmaxWorld.make(n_prompts=200, seed=1)
    tr = SimTrainer(world, build_curator("oracle_select"), prompts_per_step=8, group_size=8, seed=0, test_fraction=0.2)
    ctx = tr.context()
    chosen = tr.curator.select(ctx)
    p = ctx.oracle_pass_rates(range(len(ctx.problems)))
    s = expected_signal(p, 8)
    assert len(set(chosen)) == 8 and min(s[chosen]) >= np.sort(s)[-8] - 1e-12
    rec = tr.train_step()
    assert rec["rollouts"] == 64 and ctx.counters.uncharged_rollouts == 0
    assert ctx.knows_pass_rates


def test_oracle_alloc_splits_the_step_budget_by_the_variance_optimal_rule():
    world = SoftmaxWorld.make(n_prompts=200, seed=2)
    tr = SimTrainer(world, build_curator("oracle_alloc"), prompts_per_step=8, group_size=8, seed=0)
    ctx = tr.context()
    indices = tr.curator.select(ctx)
    groups = tr.curator.rollout(ctx, indices)
    p = ctx.oracle_pass_rates(indices)
    assert [g.size for g in groups] == optimal_allocation(p, 64, "linear", n_min=2).tolist()
    assert sum(g.size for g in groups) == 64 and min(g.size for g in groups) >= 2
    with pytest.raises(UserError, match=r"n_min must be an integer >= 1, got 0$"):
        build_curator("oracle_alloc", n_min=0)


def test_on_the_tiny_model_the_oracle_audit_is_not_charged(tmp_path, repo_root, monkeypatch):
    """The uncharged audit: the step's charged rollouts are uniform's, the audit's are logged apart, on
    their own seeds (the charged samples are the same as uniform's for the same prompts)."""
    from rlcurate.train import TrainConfig, Trainer

    monkeypatch.chdir(repo_root)
    rows = {}
    for strategy in ("uniform", "oracle_alloc"):
        cfg = TrainConfig(model="data/tiny/spread", task="arithmetic", task_kwargs={"n_train": 4, "n_test": 2},
                          strategy=strategy, strategy_kwargs={"runs": 2, "refresh": 2} if strategy != "uniform" else {},
                          steps=3, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_every=0,
                          out_dir=str(tmp_path / strategy), progress=False, save_model=False)
        Trainer(cfg).run()
        rows[strategy] = [json.loads(x) for x in (tmp_path / strategy / "metrics.jsonl").read_text().splitlines()]
    pool = 4 * 9  # 4 training prompts per level, 9 levels
    uni, ora = rows["uniform"], rows["oracle_alloc"]
    assert [r["rollouts"] for r in ora] == [r["rollouts"] for r in uni] == [16, 16, 16]
    assert [r.get("uncharged_rollouts", 0) for r in ora] == [2 * pool, 0, 2 * pool]  # audits at steps 1 and 3
    assert ora[-1]["total/uncharged_rollouts"] == 4 * pool and "uncharged_rollouts" not in uni[-1]
    assert ora[0]["curation/oracle_rollouts"] == 2 * pool and ora[1]["curation/oracle_rollouts"] == 0


def test_the_uncharged_estimate_is_a_share_of_right_answers():
    class Stub:
        tokenizer = None

        def generate(self, prompts, n, params, seed):
            from rlcurate.rollout.base import Completion

            return [[Completion(k, j, [], [1], "7" if j < k else "0", [0.0], "stop") for j in range(n)]
                    for k, _ in enumerate(prompts)]

    from rlcurate.tasks.base import Problem, Reward

    class Task:
        def reward(self, problem, text):
            return Reward(1.0 if text == "7" else 0.0, "ok")

        def render(self, problem, tok, hint=None):
            return problem.question

    problems = [Problem(uid=f"p{i}", question=f"q{i}", answer="7") for i in range(3)]
    ctx = StepContext(step=0, seed=0, problems=problems, task=Task(), group_size=4, prompts_per_step=2,
                      policy=Stub())
    assert ctx.oracle_pass_rates([0, 1, 2], runs=4).tolist() == [0.0, 0.25, 0.5]
    assert ctx.counters.uncharged_rollouts == 12 and ctx.counters.rollouts == 0 and not ctx.generated_groups


def test_between_audits_oracle_selection_takes_each_prompt_once_in_signal_order():
    """Stale estimates (an audit every 4 steps): the steps between two audits choose disjoint prompts, in
    order of their audited signal; an audit starts afresh. Exact free pass rates audit every step."""
    world = SoftmaxWorld.make(n_prompts=200, seed=5)
    tr = SimTrainer(world, build_curator("oracle_select", exact=False, refresh=4, runs=8), prompts_per_step=8,
                    group_size=8, seed=0, test_fraction=0.2)
    sel = tr.curator.selector
    picks = []
    for _ in range(8):
        ctx = tr.context()
        picks.append(tr.curator.select(ctx))
        tr.step += 1
        assert sel.oracle.audited_at == 4 * (len(picks) - 1 >= 4)
    first, second = picks[:4], picks[4:]
    assert len(set().union(*map(set, first))) == 32 and len(set().union(*map(set, second))) == 32
    s = expected_signal(np.nan_to_num(sel.oracle.p, nan=0.0), 8)
    ranked = [min(s[p]) for p in second]
    assert all(a >= max(s[b]) - 1e-12 for a, b in zip(ranked, second[1:]))  # earlier steps took larger signals
    exact = SimTrainer(world, build_curator("oracle_select"), prompts_per_step=8, group_size=8, seed=0)
    ctx = exact.context()
    assert exact.curator.select(ctx) == exact.curator.select(ctx)  # re-audited: the same best prompts again


def test_oracle_alloc_can_allocate_from_smoothed_audits():
    """``smoothed``: audited shares k / runs enter the rule as (k + 1) / (runs + 2) (chapter 3); exact pass rates
    are used as they are."""
    from rlcurate.stats.objectives import smooth_pass_rate

    world = SoftmaxWorld.make(n_prompts=200, seed=2)
    sizes = {}
    for smoothed in (False, True):
        tr = SimTrainer(world, build_curator("oracle_alloc", exact=False, runs=8, refresh=1, smoothed=smoothed),
                        prompts_per_step=16, group_size=8, seed=0)
        ctx = tr.context()
        indices = tr.curator.select(ctx)
        groups = tr.curator.rollout(ctx, indices)
        k = np.rint(tr.curator.sampler.oracle.p[indices] * 8)
        assert np.allclose(k / 8, tr.curator.sampler.oracle.p[indices])  # the audit's shares of 8 runs
        p_rule = smooth_pass_rate(k, 8) if smoothed else k / 8
        sizes[smoothed] = [g.size for g in groups]
        assert sizes[smoothed] == optimal_allocation(p_rule, 128, "linear", n_min=2).tolist()
    assert sizes[True] != sizes[False]
    # a prompt the audit got no completion for (NaN) enters at 1/2, smoothed or not
    sampler = tr.curator.sampler
    sampler.oracle.p[indices[0]] = np.nan
    sampler.oracle.audited_at, sampler.oracle.refresh = ctx.step, 10**6  # no new audit
    k = np.rint(np.nan_to_num(sampler.oracle.p[indices]) * 8)
    p_rule = np.where(np.isnan(sampler.oracle.p[indices]), 0.5, smooth_pass_rate(k, 8))
    assert [g.size for g in sampler.rollout(ctx, indices)] == optimal_allocation(p_rule, 128, "linear", n_min=2).tolist()
    exact = SimTrainer(world, build_curator("oracle_alloc", smoothed=True), prompts_per_step=8, group_size=8, seed=0)
    ctx = exact.context()
    indices = exact.curator.select(ctx)
    groups = exact.curator.rollout(ctx, indices)
    assert [g.size for g in groups] == optimal_allocation(ctx.oracle_pass_rates(indices), 64, "linear", n_min=2).tolist()
