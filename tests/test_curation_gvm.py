"""GVM (chapter 3): pilot estimates, the allocation rule, its p = 0 weakness and the min_per_prompt fix,
the language-model gradient norms, exact resume, and a smoke run on the tiny model."""

import copy
import json
import logging

import numpy as np
import pytest
import torch

from rlcurate.curation import Group, StepContext, build_curator
from rlcurate.curation.gvm import GvmSampler
from rlcurate.policy.base import SamplingPolicy
from rlcurate.policy.scoring import grad_norms as lm_grad_norms
from rlcurate.rollout.base import SamplingParams
from rlcurate.sim import SoftmaxWorld
from rlcurate.sim.bridge import SimEngine, SimTask, SimTrainer
from rlcurate.stats import gvm_allocation



# ------------------------------------------------------------------------------------------ helpers
class Sim:
    def __init__(self, world, seed=0):
        self.world = world
        self.task = SimTask(world, test_fraction=0.0, seed=seed)
        self.problems = self.task.problems("train")
        self.theta = world.init_theta()
        self.engine = SimEngine(world, self.theta)
        self.seed = seed
        self.calls = []

    def norms(self, group):
        """Exact ||grad log pi(a | x)|| per completion (what SimTrainer supplies), recording the call."""
        self.calls.append(group)
        idx = np.full(group.size, group.problem.meta["prompt"])
        acts = [c.token_ids[0] for c in group.completions]
        return np.linalg.norm(self.world.score(self.theta, idx, acts), axis=1)

    def ctx(self, step, B, n, grad_norms="exact"):
        policy = SamplingPolicy(self.engine)
        policy.grad_norms = self.norms if grad_norms == "exact" else grad_norms  # what the policy would give
        return StepContext(step=step, seed=self.seed, problems=self.problems, task=self.task, policy=policy,
                           sampling=SamplingParams(max_new_tokens=1), group_size=n, prompts_per_step=B)


@pytest.fixture()
def sim():
    # 6 prompts that are never solved, the rest spread over (0.05, 0.95)
    p = np.r_[np.full(6, 1e-4), np.linspace(0.05, 0.95, 18)]
    return Sim(SoftmaxWorld.make(n_prompts=24, pass_rates=p, seed=7))


def pilot_estimates(sim, groups, pilot):
    p, G = [], []
    for g in groups:
        first = g.subset(range(pilot))
        acc = np.flatnonzero(first.rewards > 0.7)
        p.append(acc.size / pilot)
        G.append(float(np.mean(sim.norms(first.subset(acc.tolist())))) if acc.size else 0.0)
    return np.array(p), np.array(G)


# ------------------------------------------------------------------------------------------ the sampler
def test_gvm_allocates_by_the_rule_and_starves_unsolved_prompts(sim):
    cur = build_curator("gvm")  # pilot 4, budget group_size per prompt
    cur.bind(len(sim.problems), 0)
    B, n = 24, 8
    ctx = sim.ctx(0, B, n)
    idx = cur.select(ctx)
    groups = cur.process(ctx, cur.rollout(ctx, idx))
    last = cur.sampler.last
    # compute: the pilot and the allocation, two generate calls
    assert ctx.counters.generate_calls == 2
    assert ctx.counters.rollouts == (4 + 8) * B == sum(g.generated for g in groups)
    # the training group is pilot + allocation (train_pilot=True)
    assert [g.size for g in groups] == [4 + k for k in last["n"]]
    # the estimates are those of the pilot rollouts, G over the accepted ones only
    p, G = pilot_estimates(sim, groups, 4)
    assert np.allclose(p, last["p"]) and np.allclose(G, last["G"])
    assert last["n"] == gvm_allocation(p, G, n * B, 1e-3, 2.0).tolist()
    assert sum(last["n"]) == n * B
    # prompts without an accepted pilot response get nothing: the weakness of chapter 3
    zero = p == 0
    assert zero.sum() >= 6 and all(k == 0 for k, z in zip(last["n"], zero) if z)
    assert last["starved"] == int(zero.sum())
    # at equal G the rule gives more to harder prompts: s = G / sqrt(p + 1e-3 / p)
    solved = ~zero
    ratio = np.array(last["n"])[solved] / G[solved]
    assert np.corrcoef(ratio, p[solved])[0, 1] < 0


def test_gvm_norms_are_asked_for_accepted_pilot_responses_only(sim):
    cur = build_curator("gvm", pilot=6)
    cur.bind(len(sim.problems), 0)
    ctx = sim.ctx(0, 24, 4)
    cur.rollout(ctx, cur.select(ctx))
    assert sim.calls and all(g.size >= 1 and np.all(g.rewards > 0.7) and g.size <= 6 for g in sim.calls)


def test_min_per_prompt_feeds_every_prompt(sim):
    cur = build_curator("gvm", min_per_prompt=2)
    cur.bind(len(sim.problems), 0)
    ctx = sim.ctx(0, 24, 8)
    groups = cur.rollout(ctx, cur.select(ctx))
    n = np.array(cur.sampler.last["n"])
    assert n.min() >= 2 and n.sum() == 8 * 24 and cur.sampler.last["starved"] == 0
    p, G = pilot_estimates(sim, groups, 4)
    assert n.tolist() == (2 + gvm_allocation(p, G, 6 * 24)).tolist()
    with pytest.raises(ValueError, match="min_per_prompt"):
        GvmSampler(min_per_prompt=5, budget_per_prompt=4)


def test_train_pilot_false_trains_the_allocation_only_but_counts_the_pilot(sim):
    cur = build_curator("gvm", train_pilot=False, budget_per_prompt=6)
    cur.bind(len(sim.problems), 0)
    ctx = sim.ctx(0, 24, 4)
    groups = cur.rollout(ctx, cur.select(ctx))
    n = cur.sampler.last["n"]
    assert [g.size for g in groups] == n and sum(n) == 6 * 24
    assert [g.generated for g in groups] == [4 + k for k in n]
    assert ctx.counters.rollouts == (4 + 6) * 24


def test_without_grad_norms_it_falls_back_to_the_p_only_rule(sim, caplog):
    cur = build_curator("gvm")
    cur.bind(len(sim.problems), 0)
    ctx = sim.ctx(0, 24, 4, grad_norms=None)
    with caplog.at_level(logging.WARNING, logger="rlcurate.curation.gvm"):
        groups = cur.rollout(ctx, cur.select(ctx))
    assert "no grad_norms" in caplog.text
    p, _ = pilot_estimates(sim, groups, 4)
    assert cur.sampler.last["n"] == gvm_allocation(p, (p > 0).astype(float), 4 * 24).tolist()


def test_no_accepted_pilot_anywhere_allocates_evenly():
    sim = Sim(SoftmaxWorld.make(n_prompts=5, pass_rates=np.full(5, 1e-4), seed=0))
    cur = build_curator("gvm", pilot=2, budget_per_prompt=3)
    cur.bind(5, 0)
    ctx = sim.ctx(0, 5, 4)
    groups = cur.rollout(ctx, cur.select(ctx))
    assert cur.sampler.last["n"] == [3] * 5 and [g.size for g in groups] == [5] * 5


def test_gvm_resume_is_exact(sim):
    make = lambda: build_curator("gvm", min_per_prompt=1)  # noqa: E731
    kw = dict(prompts_per_step=6, group_size=4, seed=0)
    full = SimTrainer(sim.world, make(), **kw).run(8).records[1:]
    a = SimTrainer(sim.world, make(), **kw)
    first = a.run(4).records[1:]
    b = SimTrainer(sim.world, make(), theta=a.theta, **kw)
    b.curator.load_state_dict(json.loads(json.dumps(a.curator.state_dict())))
    b.step, b.rollouts = a.step, a.rollouts
    assert first + [b.train_step() for _ in range(4)] == full
    assert all(r["rollouts"] == (4 + 4) * 6 for r in full)


# ------------------------------------------------------------------------------------------ LM gradient norms
@pytest.fixture(scope="module")
def tiny_model():
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

    return build_tiny_model(seed=3), build_tiny_tokenizer()


def test_lm_grad_norms_match_a_direct_autograd_computation(tiny_model):
    model, _ = tiny_model
    rng = np.random.default_rng(0)
    prompt = rng.integers(4, 56, size=9).tolist()
    comps = [rng.integers(4, 56, size=k).tolist() for k in (1, 5, 12)] + [[]]
    got = lm_grad_norms(model, prompt, comps)
    assert got[-1] == 0.0 and np.all(got[:-1] > 0) and len(set(np.round(got[:-1], 6))) == 3
    emb = model.get_input_embeddings().weight
    for k, c in enumerate(comps[:-1]):
        model.zero_grad(set_to_none=True)
        ids = torch.tensor([prompt + c])
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        nll = -sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(c))
        nll.backward()
        assert got[k] == pytest.approx(float(emb.grad.norm()), rel=1e-4)
    model.zero_grad(set_to_none=True)
    # it reads Completion objects as well, and leaves .grad alone
    from rlcurate.rollout.base import Completion

    objs = [Completion(0, j, prompt, c, "", [0.0] * len(c), "stop") for j, c in enumerate(comps)]
    assert np.allclose(lm_grad_norms(model, prompt, objs), got)
    assert all(p.grad is None for p in model.parameters())
    # the temperature of the log-probabilities changes the norm
    assert not np.allclose(lm_grad_norms(model, prompt, comps[:1], temperature=0.5), got[:1])
    with pytest.raises(ValueError, match="no parameter"):
        lm_grad_norms(model, prompt, comps, param_filter="nonexistent")


# ------------------------------------------------------------------------------------------ tiny model
@pytest.mark.slow
def test_gvm_smoke_on_the_tiny_model_and_the_trainer_grad_norms(spread_policy, tmp_path):
    from rlcurate.train import TrainConfig, Trainer

    model, tok, task = spread_policy
    cfg = TrainConfig(strategy="gvm", strategy_kwargs={"pilot": 2, "min_per_prompt": 1}, steps=2, prompts_per_step=4,
                      group_size=4, max_new_tokens=24, eval_every=0, out_dir=str(tmp_path), progress=False,
                      save_model=False, threads=1)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)
    tr.run()
    steps = [r for r in tr.metrics.read() if "rollouts" in r]
    assert [r["rollouts"] for r in steps] == [(2 + 4) * 4] * 2
    assert all(r["samples_trained"] == 24 for r in steps)
    # the trainer's grad_norms are rlcurate.policy.scoring.grad_norms on the policy and the rendered prompt
    ctx = tr.context(5)
    g = ctx.generate([0], 3)[0]
    expected = lm_grad_norms(tr.model, tr.engine.encode([g.prompt])[0], g.completions)
    assert np.allclose(ctx.grad_norms(g), expected) and np.all(expected > 0)
    assert isinstance(g, Group)
