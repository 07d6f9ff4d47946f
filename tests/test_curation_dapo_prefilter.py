"""DAPO dynamic sampling and the variance prefilter (chapter 6): contracts on the simulated world, a
smoke run on the tiny model, exact resume."""

import copy
import json
import logging

import numpy as np
import pytest

from rlcurate.errors import UserError

from rlcurate.curation import StepContext, build_curator
from rlcurate.curation.dapo import DapoSampler
from rlcurate.curation.prefilter import PrefilterSelector, read_audit_uids
from rlcurate.rollout.base import SamplingParams
from rlcurate.sim import SoftmaxWorld
from rlcurate.sim.bridge import SimEngine, SimTask, SimTrainer



# ------------------------------------------------------------------------------------------ helpers
def sim_setup(world, curator, seed=0, B=8, n=4):
    task = SimTask(world, test_fraction=0.0, seed=seed)
    problems = task.problems("train")
    curator.bind(len(problems), seed)
    engine = SimEngine(world, world.init_theta())

    def ctx(step):
        return StepContext(step=step, seed=seed, problems=problems, task=task, tokenizer=None, engine=engine,
                           sampling=SamplingParams(max_new_tokens=1), group_size=n, prompts_per_step=B)
    return problems, ctx


def one_step(curator, ctx):
    idx = curator.select(ctx)
    sampled = curator.rollout(ctx, idx)
    kept = curator.process(ctx, sampled)
    curator.observe(ctx, kept)
    return idx, sampled, kept


def world_pass_rates(problems, world):
    return world.pass_rates(world.init_theta())[[p.meta["prompt"] for p in problems]]


# ------------------------------------------------------------------------------------------ DAPO
@pytest.fixture(scope="module")
def polar_world():
    # Beta(0.5, 0.5) pass rates: most groups of 4 are uniform, so DAPO has to oversample.
    return SoftmaxWorld.make(n_prompts=200, pass_rate_beta=(0.3, 0.3), seed=1)


def test_dapo_trains_only_mixed_groups_and_counts_every_rollout(polar_world):
    cur = build_curator("dapo")
    problems, ctx_of = sim_setup(polar_world, cur, B=8, n=4)
    cap = cur.sampler.max_num_gen_batches
    saw_oversampling = False
    for step in range(12):
        ctx = ctx_of(step)
        idx, sampled, kept = one_step(cur, ctx)
        mixed = [g for g in sampled if g.mixed]
        # every generated rollout counted, kept or not; one generate call per generation batch
        assert ctx.counters.rollouts == sum(g.generated for g in sampled) == len(sampled) * 4
        assert ctx.counters.generate_calls == cur.sampler.last_batches == len(sampled) // 8
        assert sampled[0].index == idx[0] and [g.index for g in sampled[:8]] == idx
        # it stops as soon as B groups are mixed, or at the cap
        assert len(mixed) >= 8 or cur.sampler.last_batches == cap
        before_last = sum(g.mixed for g in sampled[:-8])
        assert before_last < 8
        saw_oversampling |= cur.sampler.last_batches > 1
        # never a uniform group; the first B mixed ones in generation order
        assert all(g.mixed for g in kept)
        assert [id(g) for g in kept] == [id(g) for g in mixed[:8]]
    assert saw_oversampling


def test_dapo_oversampling_walks_the_selector_order(polar_world):
    cur = build_curator("dapo")
    problems, ctx_of = sim_setup(polar_world, cur, B=8, n=4)
    seen = []
    for step in range(5):
        _, sampled, _ = one_step(cur, ctx_of(step))
        seen += [g.index for g in sampled]
    # the extra prompts come from the epoch order: no prompt twice until the pool is used up
    first_epoch = seen[: len(problems)]
    assert len(set(first_epoch)) == len(first_epoch)
    ref = build_curator("uniform")
    ref.bind(len(problems), 0)
    assert seen == ref.selector.draw(len(seen))


def test_dapo_gen_batch_size_tops_up_the_first_batch(polar_world):
    cur = build_curator("dapo", gen_batch_size=20, max_num_gen_batches=2)
    _, ctx_of = sim_setup(polar_world, cur, B=8, n=4)
    ctx = ctx_of(0)
    idx, sampled, kept = one_step(cur, ctx)
    assert len(idx) == 8 and len(sampled) in (20, 40)
    assert [g.index for g in sampled[:8]] == idx
    assert len(kept) <= 8 and all(g.mixed for g in kept)


def test_dapo_cap_trains_on_what_was_found(caplog):
    hard = SoftmaxWorld.make(n_prompts=50, pass_rates=np.full(50, 1e-4), seed=0)
    cur = build_curator("dapo", max_num_gen_batches=3)
    _, ctx_of = sim_setup(hard, cur, B=4, n=4)
    ctx = ctx_of(0)
    with caplog.at_level(logging.WARNING, logger="rlcurate.curation.dapo"):
        _, sampled, kept = one_step(cur, ctx)
    assert len(sampled) == 12 and ctx.counters.rollouts == 48 and ctx.counters.generate_calls == 3
    assert kept == [] and "found 0 mixed groups" in caplog.text


def test_dapo_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        DapoSampler(max_num_gen_batches=0)
    with pytest.raises(ValueError, match="gen_batch_size"):
        DapoSampler(gen_batch_size=0)
    with pytest.raises(ValueError, match="does not take"):
        build_curator("dapo", k_pos=2)


def test_dapo_resume_is_exact(polar_world, resume_identical):
    resume_identical(polar_world, lambda: build_curator("dapo"), prompts_per_step=8, group_size=4)


# ------------------------------------------------------------------------------------------ prefilter
@pytest.fixture(scope="module")
def three_kinds():
    # 20 prompts never solved, 20 always solved, 20 at p = 0.5
    p = np.r_[np.full(20, 1e-4), np.full(20, 1 - 1e-4), np.full(20, 0.5)]
    return SoftmaxWorld.make(n_prompts=60, pass_rates=p, seed=2)


def test_prefilter_audit_keeps_the_mixed_prompts_and_counts_its_rollouts(three_kinds):
    cur = build_curator("prefilter", audit_runs=8)
    problems, ctx_of = sim_setup(three_kinds, cur, B=5, n=4)
    p = world_pass_rates(problems, three_kinds)
    ctx = ctx_of(0)
    idx, sampled, _ = one_step(cur, ctx)
    kept = cur.selector.kept
    # P(an audit of 8 is uniform) = 2 / 256 at p = 1/2, ~1e-3 at the extremes
    assert set(kept) <= set(np.flatnonzero(p == 0.5))
    assert len(kept) >= 17
    assert ctx.counters.rollouts == len(problems) * 8 + 5 * 4  # audit + the step's groups
    assert cur.selector.audit_rollouts == len(problems) * 8
    # epochs over the kept subset: every kept prompt once before any repeats
    order = idx + [i for s in range(1, 10) for i in one_step(cur, ctx_of(s))[0]]
    first = order[: len(kept)]
    assert sorted(first) == sorted(kept)
    # later steps do not audit again
    ctx2 = ctx_of(10)
    one_step(cur, ctx2)
    assert ctx2.counters.rollouts == 5 * 4


def test_prefilter_from_an_audit_file(tmp_path, three_kinds, caplog):
    cur = build_curator("prefilter", audit_file=str(tmp_path / "mixed.jsonl"))
    problems, ctx_of = sim_setup(three_kinds, cur, B=4, n=4)
    chosen = [problems[i].uid for i in (3, 7, 11, 30, 41)]
    lines = [json.dumps({"uid": u, "mixed": True}) for u in chosen] + ["", json.dumps({"uid": "not/in/pool"})]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    assert read_audit_uids(tmp_path / "mixed.jsonl") == chosen + ["not/in/pool"]
    ctx = ctx_of(0)
    with caplog.at_level(logging.WARNING, logger="rlcurate.curation.prefilter"):
        idx, _, _ = one_step(cur, ctx)
    assert "1 of the 6 uids" in caplog.text
    assert ctx.counters.rollouts == 16  # no audit rollouts
    assert cur.selector.kept == [3, 7, 11, 30, 41]
    more = [i for s in range(1, 4) for i in one_step(cur, ctx_of(s))[0]]
    assert set(idx + more) == {3, 7, 11, 30, 41}


def test_prefilter_audit_file_errors(tmp_path, three_kinds):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 3}\n')
    with pytest.raises(ValueError, match="'uid' key"):
        read_audit_uids(bad)
    with pytest.raises(ValueError, match="not found"):
        read_audit_uids(tmp_path / "missing.jsonl")
    none = tmp_path / "none.jsonl"
    none.write_text('{"uid": "x"}\n')
    cur = build_curator("prefilter", audit_file=str(none))
    _, ctx_of = sim_setup(three_kinds, cur)
    with pytest.raises(ValueError, match="no uid"):
        cur.select(ctx_of(0))


def test_prefilter_nothing_mixed_raises_or_falls_back(caplog):
    flat = SoftmaxWorld.make(n_prompts=30, pass_rates=np.full(30, 1e-4), seed=0)
    cur = build_curator("prefilter", audit_runs=4)
    _, ctx_of = sim_setup(flat, cur)
    with pytest.raises(UserError, match="no mixed prompt"):
        cur.select(ctx_of(0))
    cur = build_curator("prefilter", audit_runs=4, fallback="all")
    problems, ctx_of = sim_setup(flat, cur)
    with caplog.at_level(logging.WARNING, logger="rlcurate.curation.prefilter"):
        cur.select(ctx_of(0))
    assert "falling back" in caplog.text and cur.selector.kept == list(range(len(problems)))
    with pytest.raises(ValueError, match="fallback"):
        PrefilterSelector(fallback="ignore")


def test_prefilter_reaudit_tracks_the_policy(three_kinds):
    cur = build_curator("prefilter", audit_runs=8, reaudit_every=3, reaudit_fresh=10)
    problems, ctx_of = sim_setup(three_kinds, cur, B=5, n=4)
    audit_steps = []
    for step in range(8):
        ctx = ctx_of(step)
        kept_before = None if cur.selector.kept is None else len(cur.selector.kept)
        one_step(cur, ctx)
        if ctx.counters.rollouts > 20:
            audit_steps.append(step)
            if kept_before is not None:  # re-audit: the kept prompts plus 10 dropped ones
                assert ctx.counters.rollouts == (kept_before + 10) * 8 + 20
    assert audit_steps == [0, 3, 6]
    # a kept set of p = 1/2 prompts stays (nearly) the same, extremes stay out
    p = world_pass_rates(problems, three_kinds)
    assert set(cur.selector.kept) <= set(np.flatnonzero(p == 0.5))


def test_prefilter_audit_prompts_bounds_the_audit(three_kinds):
    cur = build_curator("prefilter", audit_runs=4, audit_prompts=30)
    problems, ctx_of = sim_setup(three_kinds, cur, B=4, n=4)
    ctx = ctx_of(0)
    one_step(cur, ctx)
    assert len(cur.selector.universe) == 30 and ctx.counters.rollouts == 30 * 4 + 16
    assert set(cur.selector.kept) <= set(cur.selector.universe)


def test_prefilter_resume_is_exact(three_kinds, resume_identical):
    make = lambda: build_curator("prefilter", audit_runs=8, reaudit_every=4, reaudit_fresh=5)  # noqa: E731
    _, full = resume_identical(three_kinds, make, steps=10, split=5, prompts_per_step=4, group_size=4)
    # the state matters: a fresh prefilter (no kept set) would audit again at step 5
    a = SimTrainer(three_kinds, make(), prompts_per_step=4, group_size=4)
    a.run(5)
    b = SimTrainer(three_kinds, make(), theta=a.theta, prompts_per_step=4, group_size=4)
    b.step = 5
    assert b.train_step()["rollouts"] != full[5]["rollouts"]


# ------------------------------------------------------------------------------------------ tiny model
def tiny_run(spread_policy, tmp_path, strategy, **strategy_kwargs):
    from rlcurate.train import TrainConfig, Trainer

    model, tok, task = spread_policy
    cfg = TrainConfig(strategy=strategy, strategy_kwargs=strategy_kwargs, steps=2, prompts_per_step=4, group_size=4,
                      max_new_tokens=24, eval_every=0, out_dir=str(tmp_path), progress=False, save_model=False,
                      threads=1)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)
    tr.run()
    return tr, tr.metrics.read()


@pytest.mark.slow
def test_dapo_smoke_on_the_tiny_model(spread_policy, tmp_path):
    tr, rec = tiny_run(spread_policy, tmp_path, "dapo", max_num_gen_batches=2)
    steps = [r for r in rec if "rollouts" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["groups_trained"] == r["groups_trained_mixed"] <= 4
        assert r["rollouts"] in (16, 32)  # one or two generation batches of 4 prompts x 4
    assert json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["curator"]["selector"]["cursor"] > 0


@pytest.mark.slow
def test_prefilter_smoke_on_the_tiny_model(spread_policy, tmp_path):
    _, _, task = spread_policy
    uids = [p.uid for p in task.problems("train")[:6]]
    audit = tmp_path / "audit.jsonl"
    audit.write_text("".join(json.dumps({"uid": u}) + "\n" for u in uids))
    tr, rec = tiny_run(spread_policy, tmp_path / "run", "prefilter", audit_file=str(audit))
    steps = [r for r in rec if "rollouts" in r]
    assert [r["rollouts"] for r in steps] == [16, 16]
    assert tr.curator.selector.kept == list(range(6))
