"""DRO's dataset-level query filter (chapter 8, issue #16 item c): which queries it keeps and removes,
that its estimation rollouts are charged, carry-over, the rank rule, bad options, and end-to-end runs
on the simulated world and the tiny model."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from rlcurate.curation import StepContext, build_curator
from rlcurate.curation.dro import DROProcessor
from rlcurate.curation.dro_filter import (
    DroFilterSelector,
    QueryEstimate,
    carry_over_draw,
    filter_queries,
    worst_tokens_mean_rank,
)
from rlcurate.errors import UserError
from rlcurate.rollout.base import Completion, SamplingParams
from rlcurate.seeding import named_stream
from rlcurate.sim.bridge import SimTrainer
from rlcurate.sim.world import SoftmaxWorld


# ------------------------------------------------------------------------------------------ the rules
def test_worst_tokens_mean_rank_takes_the_bottom_share_of_the_reference_tokens():
    ranks = [1, 3, 50, 2]
    assert worst_tokens_mean_rank(ranks, 0.1) == 50  # ceil(0.4) = 1 token: the worst
    assert worst_tokens_mean_rank(ranks, 0.5) == (50 + 3) / 2  # 2 tokens
    assert worst_tokens_mean_rank(ranks, 1.0) == np.mean(ranks)
    assert worst_tokens_mean_rank([7] * 10, 0.3) == 7  # exactly 3 tokens, no float overshoot to 4
    assert worst_tokens_mean_rank([], 0.1) == 1.0


def test_filter_queries_removes_too_hard_then_the_lowest_variation():
    est = [QueryEstimate(10, False, 0.5), QueryEstimate(11, True, 9.0),  # too hard, whatever its score
           QueryEstimate(12, False, 0.0), QueryEstimate(13, False, 0.2), QueryEstimate(14, False, 0.2),
           QueryEstimate(15, False, 0.9)]
    kept, hard, low = filter_queries(est, 0.5)  # 5 not too hard: floor(2.5) = 2 removed
    assert hard == [11]
    assert low == [12, 13]  # lowest score, then the earlier of the two tied at 0.2
    assert kept == [10, 14, 15]
    assert filter_queries(est, 0.0) == ([10, 12, 13, 14, 15], [11], [])
    assert filter_queries(est, 0.99)[0] == [15]  # at least one survives
    assert filter_queries([QueryEstimate(1, True, 1.0)], 0.5) == ([], [1], [])


def test_carry_over_draw_is_a_seeded_share_of_the_previous_set():
    prev = list(range(100, 125))  # 25 queries: 10 % is 2.5, rounded to 3
    a = carry_over_draw(prev, 0.1, named_stream("t", 0))
    assert len(a) == 3 and set(a) <= set(prev) and a == sorted(a)
    assert a == carry_over_draw(prev, 0.1, named_stream("t", 0))
    assert len(carry_over_draw(prev[:24], 0.1, named_stream("t", 0))) == 2
    assert carry_over_draw(prev, 0.0, named_stream("t", 0)) == []
    assert carry_over_draw(prev, 1.0, named_stream("t", 0)) == prev


# ------------------------------------------------------------------------------------------ a scripted policy
class ScriptedPolicy:
    """A language-model policy whose teacher-forced scores are set by the test: rollout i of the
    k-th query of a ``generate`` call gets ``script[index] = (rank_rows, ell_rows)`` row i, each row
    one value for every reference token (its length is the reference answer's)."""

    def __init__(self, tokenizer, task, n_rollouts):
        self.tokenizer, self.task, self.n = tokenizer, task, n_rollouts
        self.script: dict[int, tuple[list, list]] = {}
        self.owners: list[int] = []  # the pool index of each scored context, in order

    def generate(self, prompts, n, params, seed):
        out = []
        for k, p in enumerate(prompts):
            ids = self.tokenizer.encode(p, add_special_tokens=False)
            comps = []
            for j in range(n):
                text = f"{j}+0+0={j}\n#{j}"
                comps.append(Completion(k, j, ids, self.tokenizer.encode(text, add_special_tokens=False)
                                        + [self.tokenizer.eos_token_id], text, [0.0], "stop"))
            out.append(comps)
        return out

    def sequence_logprobs_and_ranks(self, contexts, continuations, token_budget=None):
        assert len(contexts) == len(self.owners) * self.n
        out = []
        for c, (idx, i) in enumerate((o, i) for o in self.owners for i in range(self.n)):
            J = len(continuations[c])
            ranks, ells = self.script[idx]
            row_r = ranks[i] if isinstance(ranks[i], list) else [ranks[i]] * J
            out.append((np.full(J, float(ells[i])), np.array(row_r[:J] if len(row_r) >= J else
                                                              [1] * (J - len(row_r)) + row_r, dtype=np.int64)))
        return out

    def update(self, groups, advantages):
        return {}


@pytest.fixture(scope="module")
def tok():
    from rlcurate.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def task():
    from rlcurate.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(levels=["add2"], n_train=6, n_test=2)


def scripted_setup(tok, task, N=4, **kw):
    problems = task.problems()
    policy = ScriptedPolicy(tok, task, N)
    policy.owners = list(range(len(problems)))  # a round estimates the whole pool, in pool order
    sel = DroFilterSelector(rollouts=N, **kw)
    sel.bind(len(problems), 0)

    def ctx(step):
        return StepContext(step=step, seed=0, problems=problems, task=task, group_size=2, prompts_per_step=2,
                           policy=policy, sampling=SamplingParams(max_new_tokens=8))
    return sel, policy, ctx


# ranks per rollout (a number: every reference token; a list: the last tokens), log-prob per rollout
SCRIPT = {
    0: ([1, 1, 1, 1], [-0.1, -2.0, -0.5, -1.0]),   # easy for one CoT, spread 0.73: kept
    1: ([50, 60, 70, 80], [-0.1, -5.0, -3.0, -1.0]),  # no CoT within the top 10: too hard
    2: ([1, 1, 1, 1], [-0.3, -0.3, -0.3, -0.3]),    # every CoT alike: sigma 0, lowest variation
    3: ([[25], 40, 40, 40], [-0.2, -1.0, -0.4, -0.6]),  # one CoT: one token at rank 25, the rest at 1
    4: ([10, 30, 30, 30], [-0.2, -0.4, -0.3, -0.5]),  # a CoT exactly at k = 10: not too hard
    5: ([1, 2, 3, 4], [-0.1, -0.9, -2.5, -4.0]),    # the largest spread: kept
}


def test_a_round_keeps_and_removes_the_right_queries(tok, task):
    sel, policy, ctx_of = scripted_setup(tok, task, drop_fraction=0.25, rank_fraction=0.1, rank_top_k=10)
    policy.script = SCRIPT
    ctx = ctx_of(0)
    picked = sel.select(ctx, 2)
    rnd = sel.last_round
    # query 3's only good CoT has a worst token at rank 25 > 10: too hard with rho = 10 % (one token)
    assert rnd.too_hard == [1, 3]
    est = {e.index: e for e in rnd.estimates}
    assert est[4].best_rank == 10 and not est[4].too_hard
    assert est[2].score == pytest.approx(0.0)
    assert est[0].score == pytest.approx(np.std([-0.1, -2.0, -0.5, -1.0]))
    # 4 queries are not too hard: floor(0.25 * 4) = 1 removed, the lowest max sigma
    assert rnd.low_variation == [2]
    assert rnd.carried == [] and sel.kept == [0, 4, 5]
    assert set(picked) <= {0, 4, 5}
    # with rho = 100 % query 3's first CoT averages its tokens (mostly rank 1) and passes
    sel2, policy2, ctx_of2 = scripted_setup(tok, task, drop_fraction=0.25, rank_fraction=1.0, rank_top_k=10)
    policy2.script = SCRIPT
    sel2.select(ctx_of2(0), 2)
    assert sel2.last_round.too_hard == [1]
    e3 = next(e for e in sel2.last_round.estimates if e.index == 3)
    J = len(tok.encode(task.format_answer(task.problems()[3].answer), add_special_tokens=False)) + 1
    assert e3.best_rank == pytest.approx((J - 1 + 25) / J) and e3.best_rank <= 10


def test_estimation_rollouts_are_charged_in_the_ledger(tok, task):
    N = 4
    sel, policy, ctx_of = scripted_setup(tok, task, N=N)
    policy.script = SCRIPT
    ctx = ctx_of(0)
    sel.select(ctx, 2)
    n_pool = len(task.problems())
    assert ctx.counters.rollouts == n_pool * N and ctx.counters.generate_calls == 1
    assert sum(g.generated for g in ctx.generated_groups) == n_pool * N
    assert sel.last_round.rollouts == sel.estimate_rollouts == n_pool * N
    assert sel.metrics()["dro_filter_estimate_rollouts"] == n_pool * N
    # between rounds selection generates nothing
    ctx1 = ctx_of(1)
    sel.select(ctx1, 1)
    assert ctx1.counters.rollouts == 0 and sel.metrics()["dro_filter_round"] == 0


def test_carry_over_adds_back_a_share_of_the_previous_set(tok, task, caplog):
    sel, policy, ctx_of = scripted_setup(tok, task, drop_fraction=0.0, carry_over=0.5, every=1)
    policy.script = SCRIPT
    sel.select(ctx_of(0), 2)
    first = list(sel.kept)
    assert first == [0, 2, 4, 5]  # only the too-hard 1 and 3 removed
    # the policy changes: now every query but 2 is too hard
    policy.script = {i: ([99] * 4, v[1]) for i, v in SCRIPT.items()}
    policy.script[2] = SCRIPT[2]
    sel.select(ctx_of(1), 2)
    rnd = sel.last_round
    assert rnd.previous == first and rnd.too_hard == [0, 1, 3, 4, 5]
    assert len(rnd.carried) == 2 and set(rnd.carried) <= set(first)  # round(0.5 * 4)
    assert sel.kept == sorted({2} | set(rnd.carried))  # carried although this round found them too hard
    assert rnd.carried == carry_over_draw(first, 0.5, named_stream("dro_filter_carry", 0, 1))
    # without carry-over a round that removes everything keeps the previous set, with a warning
    sel0, policy0, ctx_of0 = scripted_setup(tok, task, drop_fraction=0.0, carry_over=0.0, every=1)
    policy0.script = SCRIPT
    sel0.select(ctx_of0(0), 2)
    policy0.script = {i: ([99] * 4, v[1]) for i, v in SCRIPT.items()}
    with caplog.at_level(logging.WARNING, logger="rlcurate.curation.dro_filter"):
        sel0.select(ctx_of0(1), 2)
    assert sel0.last_round.fallback and sel0.kept == [0, 2, 4, 5]
    assert "removed every one of its 6 queries" in caplog.text


def test_rounds_come_after_each_pass_or_every_k_steps(tok, task):
    sel, policy, ctx_of = scripted_setup(tok, task, drop_fraction=0.25)  # kept: 3 queries, 2 per step
    policy.script = SCRIPT
    rounds = []
    for step in range(6):
        sel.select(ctx_of(step), 2)
        rounds.append(sel.metrics()["dro_filter_round"])
    # steps 0 and 1 draw 4 of the 3 kept (the pass ends inside step 1): a round at step 2; again at 4
    assert rounds == [1, 0, 1, 0, 1, 0]
    sel3, policy3, ctx_of3 = scripted_setup(tok, task, every=3)
    policy3.script = SCRIPT
    got = []
    for step in range(7):
        sel3.select(ctx_of3(step), 2)
        got.append(sel3.metrics()["dro_filter_round"])
    assert got == [1, 0, 0, 1, 0, 0, 1]


def test_reference_signal_needs_a_language_model():
    tr = SimTrainer(SoftmaxWorld.make(n_prompts=32, seed=0), build_curator("dro_filter"), prompts_per_step=4)
    with pytest.raises(ValueError, match="signal='reward'"):
        tr.run(1)


# ------------------------------------------------------------------------------------------ bad options
BAD = [
    ({"every": 0}, "every must be an integer >= 1, got 0"),
    ({"rollouts": 1}, "rollouts must be an integer >= 2, got 1"),
    ({"drop_fraction": 1.0}, "drop_fraction must be a number in [0, 1), got 1.0"),
    ({"drop_fraction": "half"}, "drop_fraction must be a number in [0, 1), got 'half'"),
    ({"rank_fraction": 0}, "rank_fraction must be a number in (0, 1], got 0"),
    ({"rank_top_k": 0}, "rank_top_k must be an integer >= 1, got 0"),
    ({"carry_over": 1.5}, "carry_over must be a number in [0, 1], got 1.5"),
    ({"round_prompts": 0}, "round_prompts must be an integer >= 1, got 0"),
    ({"signal": "logprob"}, "signal must be one of reference, reward, got 'logprob'"),
    ({"append_eos": "yes"}, "append_eos must be true or false, got 'yes'"),
    ({"token_budget": 0}, "token_budget must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("kwargs,message", BAD, ids=[next(iter(k)) + "-" + str(next(iter(k.values()))) for k, _ in BAD])
def test_bad_dro_filter_options_give_one_clear_value_error(kwargs, message):
    with pytest.raises(ValueError) as direct:
        DroFilterSelector(**kwargs)
    assert str(direct.value) == message
    with pytest.raises(UserError) as built:  # UserError is a ValueError: one line naming the strategy
        build_curator("dro_filter", **kwargs)
    text = str(built.value)
    assert "\n" not in text and text.startswith("strategy 'dro_filter', strategy_kwargs") and text.endswith(message)
    with pytest.raises(UserError, match="strategy 'dro_filter'"):
        build_curator("dro_filter+dro", **kwargs)


def test_dro_filter_option_names_do_not_collide_with_dro_except_the_shared_ones():
    from rlcurate.curation.registry import options

    shared = set(options("dro_filter")) & set(options("dro"))
    assert shared == {"answer_template", "append_eos", "token_budget"}  # same meaning in both parts
    cur = build_curator("dro_filter+dro", use_as="token_weights", rollouts=8, token_budget=4096)
    assert isinstance(cur.selector, DroFilterSelector) and isinstance(cur.processors[0], DROProcessor)
    assert cur.selector.rollouts == 8 and cur.selector.token_budget == cur.processors[0].token_budget == 4096
    assert cur.processors[0].filter_fraction == 0.0  # the per-step group filter stays off


# ------------------------------------------------------------------------------------------ end to end
def test_simulated_world_runs_end_to_end_and_charges_every_round():
    world = SoftmaxWorld.make(n_prompts=80, seed=3)
    B, G, N = 8, 4, 8
    tr = SimTrainer(world, build_curator("dro_filter", signal="reward", rollouts=N), prompts_per_step=B, group_size=G)
    sel = tr.curator.selector
    drawn = []
    draw = sel.draw
    sel.draw = lambda k: drawn.append((list(sel.kept), draw(k))) or drawn[-1][1]
    res = tr.run(10)
    n_pool = len(tr.train_problems)
    recs = res.records[1:]
    for r in recs:
        assert r["rollouts"] == B * G + (n_pool * N if r["curation/dro_filter_round"] else 0)
        assert np.isfinite(r["held_out"])
    assert recs[0]["curation/dro_filter_round"] == 1 and sum(r["curation/dro_filter_round"] for r in recs) >= 2
    assert res.records[-1]["total_rollouts"] == sum(r["rollouts"] for r in recs) == tr.rollouts
    assert all(set(picked) <= set(kept) for kept, picked in drawn)
    assert sel.estimate_rollouts == n_pool * N * sum(r["curation/dro_filter_round"] for r in recs)
    # the kept set leaves out the prompts no rollout solved
    first = recs[0]
    assert first["curation/dro_filter_too_hard"] > 0 and first["curation/dro_filter_kept"] < n_pool


@pytest.mark.parametrize("strategy", ["dro_filter+dapo", "dro_filter+ada_seq_balanced"])
def test_the_filter_composes_with_other_samplers_on_the_simulated_world(strategy):
    tr = SimTrainer(SoftmaxWorld.make(n_prompts=64, seed=1), build_curator(strategy, signal="reward"),
                    prompts_per_step=4, group_size=4)
    res = tr.run(4)
    assert all(np.isfinite(r["held_out"]) for r in res.records)
    assert res.records[1]["curation/dro_filter_estimate_rollouts"] == len(tr.train_problems) * 16


def test_resume_continues_exactly():
    world = SoftmaxWorld.make(n_prompts=64, seed=2)

    def make():
        return build_curator("dro_filter", signal="reward", rollouts=4, round_prompts=20)

    kw = dict(prompts_per_step=4, group_size=4)
    full = SimTrainer(world, make(), **kw).run(9).records[1:]
    a = SimTrainer(world, make(), **kw)
    first = a.run(4).records[1:]
    state = json.loads(json.dumps(a.curator.state_dict()))
    b = SimTrainer(world, make(), theta=a.theta, **kw)
    b.curator.load_state_dict(state)
    b.step, b.rollouts = a.step, a.rollouts
    rest = [b.train_step() for _ in range(5)]
    assert first + rest == full
    assert any(r["curation/dro_filter_round"] for r in rest)  # the resumed part holds a round


def test_round_prompts_walk_a_seeded_pass_over_the_pool():
    tr = SimTrainer(SoftmaxWorld.make(n_prompts=40, seed=0),
                    build_curator("dro_filter", signal="reward", rollouts=2, round_prompts=12, every=1),
                    prompts_per_step=2, group_size=2)
    sel = tr.curator.selector
    seen = []
    for _ in range(3):
        tr.train_step()
        seen.append(sel.last_round.candidates)
    n_pool = len(tr.train_problems)  # 32: rounds take 12, 12, then the last 8 and 4 of the next pass
    assert [len(c) for c in seen] == [12, 12, 12]
    assert len(set(seen[0]) | set(seen[1])) == 24 and len(set(seen[0] + seen[1] + seen[2][:8])) == n_pool


# ------------------------------------------------------------------------------------------ the tiny model
@pytest.fixture(scope="module")
def tiny():
    """The tiny model (the ``spread`` checkpoint when present) on one torch thread, restored after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster on a busy 2-core machine
    path = Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread"
    if (path / "config.json").is_file():
        from rlcurate.models import load_policy

        yield load_policy(str(path), device="cpu", dtype="fp32")
    else:
        from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

        yield build_tiny_model(seed=0), build_tiny_tokenizer()
    torch.set_num_threads(n)


def test_ranks_and_logprobs_equal_a_direct_forward_pass(tiny):
    import torch

    from rlcurate.policy.scoring import sequence_logprobs, sequence_logprobs_and_ranks

    model, tok = tiny
    contexts = [tok.encode("<|user|>12+34=?<|assistant|>1+3=4\n", add_special_tokens=False),
                tok.encode("<|user|>5+6=?<|assistant|>", add_special_tokens=False)]
    conts = [tok.encode("#46", add_special_tokens=False) + [tok.eos_token_id],
             tok.encode("#11", add_special_tokens=False)]
    got = sequence_logprobs_and_ranks(model, contexts, conts, pad_id=tok.pad_token_id, token_budget=24)
    ref = sequence_logprobs(model, contexts, conts, pad_id=tok.pad_token_id)
    for (lp, rk), c, y, lp_ref in zip(got, contexts, conts, ref):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([c + y])).logits[0].double()
        pos = range(len(c) - 1, len(c) + len(y) - 1)
        direct_lp = [float(torch.log_softmax(logits[p], -1)[t]) for p, t in zip(pos, y)]
        direct_rk = [int((logits[p] > logits[p, t]).sum()) + 1 for p, t in zip(pos, y)]
        np.testing.assert_allclose(lp, direct_lp, atol=2e-5)
        np.testing.assert_allclose(lp, lp_ref, atol=2e-5)
        assert rk.tolist() == direct_rk and rk.dtype == np.int64


def test_tiny_model_trains_with_the_filter_and_dro_token_weights(tmp_path, tiny):
    import copy

    from rlcurate.tasks.arithmetic import ArithmeticTask
    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    model, tok = tiny
    kwargs = {"use_as": "token_weights", "rollouts": 4, "round_prompts": 8, "every": 2}
    cfg = TrainConfig(strategy="dro_filter+dro", strategy_kwargs=kwargs, steps=3, prompts_per_step=2, group_size=4,
                      max_new_tokens=24, eval_every=0, out_dir=str(tmp_path), progress=False, save_model=False,
                      threads=1)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok,
                 task=ArithmeticTask(levels=["add2", "add3"], n_train=32, n_test=4))
    tr.run()
    recs = [r for r in tr.metrics.read() if "rollouts" in r]
    assert [r["rollouts"] for r in recs] == [8 * 4 + 2 * 4, 2 * 4, 8 * 4 + 2 * 4]  # rounds at steps 1 and 3
    sel = tr.curator.selector
    assert sel.estimate_rollouts == 2 * 8 * 4 and sel.last_round.estimates[0].best_rank is not None
    assert len(tr.curator.processors[0].last_stats) == 2  # DRO's token weights ran on the trained groups
    rnd = sel.last_round
    assert set(sel.kept) == (set(rnd.candidates) - set(rnd.too_hard) - set(rnd.low_variation)) | set(rnd.carried) \
        or rnd.fallback


def test_the_train_command_refuses_a_bad_filter_option_in_one_line(capsys, tmp_path):
    from rlcurate.cli import main

    out = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "configs" / "tiny_uniform.yaml"
    rc = main(["train", "--config", str(config), "--set", f"out_dir={out}", "--set", "strategy=dro_filter+dro",
               "--set", "strategy_kwargs={rollouts: 1}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0] == ("rlcurate train: error: strategy 'dro_filter', strategy_kwargs {'rollouts': 1}: "
                      "rollouts must be an integer >= 2, got 1")
    assert not out.exists()  # refused before any work
