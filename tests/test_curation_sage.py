"""Hinting collapsed prompts (chapter 7): SAGE and SAGE-LIGHT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlcurate.curation import build_curator
from rlcurate.curation.base import StepContext
from rlcurate.curation.sage import (
    HINT_SYSTEM_PROMPT,
    HintSource,
    SageLightSampler,
    SageSampler,
    fallback_hints,
    next_level_code,
    next_level_paper,
    parse_hint_payload,
)
from rlcurate.rollout.base import Completion, RolloutEngine, SamplingParams
from rlcurate.sim.bridge import SimTrainer
from rlcurate.sim.world import SoftmaxWorld
from rlcurate.tasks.base import Problem, Reward, Task

G = 4


# ---------------------------------------------------------------------------------------- fakes
class FakeTask(Task):
    """Problems whose rendered prompt is ``uid||hint``; a completion "1" is correct."""

    name = "fake"

    def __init__(self, uids, steps=("s1", "s2", "s3", "s4")):
        self._p = [Problem(uid=u, question=f"question {u}", answer="1", solution=tuple(steps)) for u in uids]

    def problems(self, split="train"):
        return self._p

    def messages(self, problem, hint=None):
        return [{"role": "user", "content": problem.question}]

    def render(self, problem, tokenizer=None, hint=None):
        return f"{problem.uid}||{hint or ''}"

    def hint(self, problem, level):
        return f"L{level}"

    def _score(self, problem, completion):
        return Reward(1.0 if completion == "1" else 0.0)


class SelfHintTask(FakeTask):
    hint = None  # no task hints: the policy must write them


class FakeEngine(RolloutEngine):
    """Rollouts: ``successes(uid, level)`` of each group are correct, the level read from the hint
    ("L2" -> 2). Hint requests (prompts holding "Solution:") get ``hint_reply(question, attempt)``."""

    def __init__(self, successes, hint_reply=None):
        self.successes = successes
        self.hint_reply = hint_reply
        self.calls: list[list[str]] = []
        self.hint_attempts: dict[str, int] = {}

    def _generate(self, prompts, counts, params, seed, progress):
        self.calls.append(list(prompts))
        out = []
        for k, (p, c) in enumerate(zip(prompts, counts)):
            if "Solution:" in p:
                q = p.split("Question: \n", 1)[1].split("\n", 1)[0]
                n = self.hint_attempts[q] = self.hint_attempts.get(q, 0) + 1
                text = self.hint_reply(q, n)
                out.append([Completion(k, j, [], [7] * 5, text, [0.0] * 5, "stop") for j in range(c)])
                continue
            uid, hint = p.split("||")
            level = int(hint[1:]) if hint.startswith("L") else 0
            n_pos = self.successes(uid, level)
            out.append([Completion(k, j, [], [1, 2], "1" if j < n_pos else "0", [0.0, 0.0], "stop")
                        for j in range(c)])
        return out


def make_ctx(task, engine, step=0, tokenizer=None):
    return StepContext(step=step, seed=0, problems=task.problems(), task=task, tokenizer=tokenizer, engine=engine,
                       sampling=SamplingParams(max_new_tokens=4), group_size=G, prompts_per_step=len(task.problems()))


# a: needs level 2; b: never solved; c: mixed at level 0; d: all correct at level 0
RULE = {"a": {0: 0, 1: 0, 2: 2, 3: 3}, "b": {0: 0, 1: 0, 2: 0, 3: 0}, "c": {0: 2}, "d": {0: G}}


def rule(uid, level):
    return RULE[uid].get(level, 0)


# ---------------------------------------------------------------------------------------- SAGE
def test_sage_hints_only_all_zero_groups_and_stops_at_the_first_level_with_a_success():
    task = FakeTask("abcd")
    engine = FakeEngine(rule)
    ctx = make_ctx(task, engine)
    groups = SageSampler().rollout(ctx, [0, 1, 2, 3])
    # calls: level 0 for all; level 1 for a, b; level 2 for a, b; level 3 for b only
    assert engine.calls == [["a||", "b||", "c||", "d||"], ["a||L1", "b||L1"], ["a||L2", "b||L2"], ["b||L3"]]
    a, b, c, d = groups
    assert (a.hint_level, a.prompt, a.successes) == (2, "a||L2", 2.0)
    assert (b.hint_level, b.prompt) == (3, "b||L3") and b.rewards.max() == 0  # kept although all zero
    assert (c.hint_level, c.prompt, d.hint_level, d.prompt) == (0, "c||", 0, "d||")  # all-correct: not hinted
    assert [g.size for g in groups] == [G] * 4
    assert (a.generated, b.generated, c.generated, d.generated) == (3 * G, 4 * G, G, G)
    assert ctx.counters.rollouts == (4 + 2 + 2 + 1) * G
    # unhinted evidence of the rescued prompts: their level-0 group, 0 of G
    assert (a.pool_successes, a.pool_size, b.pool_successes, b.pool_size) == (0.0, G, 0.0, G)
    assert c.pool_size is None


def test_sage_leaves_a_batch_without_collapse_alone():
    task = FakeTask("cd")
    engine = FakeEngine(rule)
    groups = SageSampler().rollout(make_ctx(task, engine), [0, 1])
    assert len(engine.calls) == 1 and all(g.hint_level == 0 for g in groups)


def test_self_hints_are_requested_for_collapsed_prompts_only_with_retries_and_fallback():
    from rlcurate.models.tiny import build_tiny_tokenizer

    good = json.dumps({"level_1": "L1", "level_2": "L2", "level_3": "L3"})

    def reply(question, attempt):  # a parses at its 3rd attempt, b never
        if question.endswith("a") and attempt == 3:
            return "Sure.\n```json\n" + good + "\n```"
        return "I cannot write JSON"

    task = SelfHintTask("abc")
    engine = FakeEngine(rule, reply)
    ctx = make_ctx(task, engine, tokenizer=build_tiny_tokenizer())
    sampler = SageSampler()
    groups = sampler.rollout(ctx, [0, 1, 2])
    requests = [p for call in engine.calls for p in call if "Solution:" in p]
    assert all(HINT_SYSTEM_PROMPT in p for p in requests)
    assert {p.split("Question: \n")[1].split("\n")[0] for p in requests} == {"question a", "question b"}
    assert engine.hint_attempts == {"question a": 3, "question b": 3}  # max_retries = 3
    src = sampler.hints
    assert (src.requests, src.attempts, src.failed) == (2, 3, 1)
    a, b, c = groups
    assert a.prompt == "a||L2" and a.hint_level == 2
    # b fell back to revealed reference steps: level 3 of 3 shows 3 of its 4 steps
    assert b.prompt == "b||" + task.problems()[1].reveal(3) and b.hint_level == 3
    assert c.hint_level == 0
    # hint generations count as generated tokens (6 generations x 5 tokens), not as rollouts
    assert ctx.counters.rollouts == (3 + 2 + 2 + 1) * G
    rollout_tokens = 2 * ctx.counters.rollouts
    assert ctx.counters.generated_tokens == rollout_tokens + 6 * 5
    assert a.generated_tokens == 3 * G * 2 + 3 * 5 and c.generated_tokens == G * 2


def test_hint_cache_is_per_step():
    task = SelfHintTask("b")
    good = json.dumps({"level_1": "L1", "level_2": "L2", "level_3": "L3"})
    engine = FakeEngine(rule, lambda q, n: good)
    from rlcurate.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    src = HintSource("self")
    ctx = make_ctx(task, engine, step=0, tokenizer=tok)
    src.hints(ctx, [0])
    src.hints(ctx, [0])
    assert engine.hint_attempts["question b"] == 1
    src.hints(make_ctx(task, engine, step=1, tokenizer=tok), [0])
    assert engine.hint_attempts["question b"] == 2


def test_parse_hint_payload_variants():
    want = {1: "a", 2: "b\nc", 3: "d"}
    assert parse_hint_payload('{"level_1": "a", "level_2": "b\\nc", "level_3": "d"}') == want
    assert parse_hint_payload('Here:\n```json\n{"level_1": "a", "level_2": "b\\nc", "level_3": "d",}\n```') == want
    assert parse_hint_payload('```\n{"level_1": "a",\n "level_2": "b\\nc", "level_3": "d"}\n```') == want
    assert parse_hint_payload('{"level_1": "a", "level_2": "b\\nc", "level_3": "d"} trailing') == want
    assert parse_hint_payload('{"level_1": "a", "level_2": "b"}') is None  # a level is missing
    assert parse_hint_payload('{"level_1": "a", "level_2": "", "level_3": "d"}') is None
    assert parse_hint_payload("no json here") is None
    assert parse_hint_payload("") is None


def test_fallback_hints_reveal_growing_prefixes_of_the_solution():
    p = Problem(uid="x", question="q", answer="9", solution=("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"))
    assert fallback_hints(p) == {1: "s1\ns2", 2: "s1\ns2\ns3\ns4", 3: "s1\ns2\ns3\ns4\ns5\ns6"}
    one = Problem(uid="y", question="q", answer="9", solution=("s1",))
    assert fallback_hints(one) == {1: "s1", 2: "s1", 3: "s1"}
    assert fallback_hints(Problem(uid="z", question="q", answer="9")) == {1: "", 2: "", 3: ""}


# ---------------------------------------------------------------------------------------- SAGE-LIGHT
def test_level_rules():
    # code: +1 if acc <= 0.1, -1 if acc > 0.35, unchanged in between, clipped to [0, 3]
    assert [next_level_code(lv, 0.0) for lv in range(4)] == [1, 2, 3, 3]
    assert [next_level_code(lv, 0.1) for lv in range(4)] == [1, 2, 3, 3]
    assert [next_level_code(lv, 0.2) for lv in range(4)] == [0, 1, 2, 3]
    assert [next_level_code(lv, 0.35) for lv in range(4)] == [0, 1, 2, 3]
    assert [next_level_code(lv, 0.5) for lv in range(4)] == [0, 0, 1, 2]
    # paper: +1 if acc < alpha = 0.35, otherwise unchanged
    assert [next_level_paper(lv, 0.3) for lv in range(4)] == [1, 2, 3, 3]
    assert [next_level_paper(lv, 0.35) for lv in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize("rule_name", ["code", "paper"])
def test_sage_light_level_map_follows_the_rule(rule_name):
    # prompt a: accuracy by level 0, 0, 1/2, 3/4; prompt d: always all correct
    task = FakeTask("ad")
    engine = FakeEngine(rule)
    sampler = SageLightSampler(rule=rule_name)
    step_fn = next_level_code if rule_name == "code" else next_level_paper
    expected_level, prev = {0: 0, 1: 0}, {}
    for step in range(8):
        ctx = make_ctx(task, engine, step=step)
        groups = sampler.rollout(ctx, [0, 1])
        for i, g in zip([0, 1], groups):
            want = 0 if i not in prev else step_fn(*prev[i])
            assert g.hint_level == want
            assert g.prompt == f"{'ad'[i]}||{'L%d' % want if want else ''}"
            prev[i] = (g.hint_level, float(np.mean(g.rewards > 0)))
        assert ctx.counters.rollouts == 2 * G  # one group per prompt, no level-0 probe
        sampler.observe(ctx, groups)
    levels_a = sampler.last_level[0]
    assert levels_a in ((1, 2) if rule_name == "code" else (2,))  # code oscillates 1 <-> 2, paper settles at 2
    assert sampler.last_level[1] == 0


# ---------------------------------------------------------------------------------------- simulated world
def sim(name, steps, seed, beta=(0.3, 1.5), **kw):
    world = SoftmaxWorld.make(pass_rate_beta=beta, seed=seed)
    tr = SimTrainer(world, build_curator(name, **kw), prompts_per_step=16, group_size=8, seed=seed)
    return tr, tr.run(steps)


def test_sage_light_state_round_trip():
    _, full = sim("sage_light", 10, seed=2)
    first, part1 = sim("sage_light", 5, seed=2)
    state = json.loads(json.dumps(first.curator.state_dict()))
    assert state["sampler"]["visits"]
    again = SimTrainer(first.world, build_curator("sage_light"), prompts_per_step=16, group_size=8, seed=2,
                       theta=first.theta)
    again.curator.load_state_dict(state)
    again.step, again.rollouts = first.step, first.rollouts
    part2 = again.run(5)
    assert part1.records[1:] + part2.records[1:] == full.records[1:]


def test_hinting_raises_the_effective_prompt_ratio_on_a_hard_world():
    """A world of mostly hard prompts (initial pass rates ~ Beta(0.3, 1.5)): SAGE rescues collapsed
    groups with hints, SAGE-LIGHT schedules hints; both open the gate more often than plain GRPO.
    The held-out (no-hint) pass rate is measured, not assumed: at equal *steps* it rises here (3 seeds,
    80 steps: 0.41 uniform, 0.51 SAGE, 0.47 SAGE-LIGHT); at equal *rollouts* uniform GRPO, given SAGE's
    extra rollouts as extra steps, ends higher in this world (see chapter 7)."""
    res = {}
    for name in ["uniform", "sage", "sage_light"]:
        eff, held, rollouts = [], [], []
        for seed in range(3):
            _, r = sim(name, 80, seed)
            eff.append(np.mean(r.column("effective_prompt_ratio")[1:]))
            held.append(r.records[-1]["held_out"])
            rollouts.append(r.records[-1]["total_rollouts"])
        res[name] = (np.mean(eff), np.mean(held), np.mean(rollouts))
    assert res["sage"][0] > res["uniform"][0] + 0.1, res
    assert res["sage_light"][0] > res["uniform"][0] + 0.05, res
    assert res["sage"][2] > res["uniform"][2] == res["sage_light"][2]  # SAGE pays for its re-rolls
    assert res["sage"][1] > res["uniform"][1] + 0.05, res  # held-out, no hint, equal steps
    print({k: tuple(round(float(x), 3) for x in v) for k, v in res.items()})


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The smoke runs use one torch thread (``threads=1``: far faster on a busy 2-core machine);
    give the rest of the session its thread count back."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------------------------- tiny model
def tiny_policy():
    path = Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread"
    if (path / "config.json").is_file():
        from rlcurate.models import load_policy

        return load_policy(str(path), device="cpu", dtype="fp32")
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

    return build_tiny_model(seed=0), build_tiny_tokenizer()


def tiny_trainer(name, tmp_path, **kw):
    from rlcurate.tasks.arithmetic import ArithmeticTask
    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    model, tok = tiny_policy()
    cfg = TrainConfig(strategy=name, steps=2, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=0,
                      out_dir=str(tmp_path), progress=False, save_model=False, threads=1, strategy_kwargs=kw)
    return Trainer(cfg, model=model, tokenizer=tok, task=ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8))


def test_sage_on_the_tiny_model_trains_on_the_hinted_prompt(tmp_path):
    tr = tiny_trainer("sage", tmp_path)
    seen = []
    sampler = tr.curator.sampler
    rollout = sampler.rollout
    sampler.rollout = lambda ctx, idx: seen.append(rollout(ctx, idx)) or seen[-1]
    tr.run()
    recs = [r for r in tr.metrics.read() if "rollouts" in r]
    assert len(recs) == 2 and all(r["groups_trained"] == 4 for r in recs)
    task, tok = tr.task, tr.tokenizer
    for groups, rec in zip(seen, recs):
        assert rec["rollouts"] == sum(g.generated for g in groups)
        for g in groups:
            hint = task.hint(g.problem, g.hint_level) if g.hint_level else None
            assert g.prompt == task.render(g.problem, tok, hint=hint)
            # sampled from the prompt the trainer scores: log-probs are conditioned on the hint
            assert g.completions[0].prompt_token_ids == tr.engine.encode([g.prompt])[0]
            if g.hint_level:
                assert task.hint(g.problem, g.hint_level) in g.prompt
                assert g.generated == (g.hint_level + 1) * 4
            if g.hint_level < 3:
                assert g.rewards.max() > 0 or g.hint_level == 0


def test_sage_light_on_the_tiny_model(tmp_path):
    tr = tiny_trainer("sage_light", tmp_path)
    tr.run()
    recs = [r for r in tr.metrics.read() if "rollouts" in r]
    assert [r["rollouts"] for r in recs] == [16, 16]
    saved = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["curator"]["sampler"]
    assert len(saved["visits"]) == 8  # 2 steps x 4 distinct prompts of the first epoch
