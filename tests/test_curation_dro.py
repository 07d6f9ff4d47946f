"""DRO's reasoning-reflective reference likelihood R3 and its query filter (chapter 8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlcurate.curation import build_curator
from rlcurate.curation.base import Group, StepContext
from rlcurate.curation.dro import (
    DROProcessor,
    answer_span_weights,
    reasoning_token_count,
    reference_answer_text,
    reflectivity_weights,
)
from rlcurate.policy.model import ModelPolicy
from rlcurate.rollout.base import Completion
from rlcurate.tasks.arithmetic import ArithmeticTask


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: far faster on a busy 2-core machine; restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def policy():
    path = Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread"
    if (path / "config.json").is_file():
        from rlcurate.models import load_policy

        return load_policy(str(path), device="cpu", dtype="fp32")
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

    return build_tiny_model(seed=0), build_tiny_tokenizer()


@pytest.fixture(scope="module")
def task():
    return ArithmeticTask(levels=["add2", "add3"], n_train=16, n_test=4)


def make_group(task, tok, index, texts) -> Group:
    problem = task.problems()[index]
    prompt = task.render(problem, tok)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    comps = [Completion(prompt_index=0, sample_index=j, prompt_token_ids=prompt_ids,
                        token_ids=tok.encode(t, add_special_tokens=False) + [tok.eos_token_id], text=t,
                        logprobs=[0.0] * (len(t) + 1), finish_reason="stop") for j, t in enumerate(texts)]
    rewards = np.array([task.reward(problem, t).value for t in texts])
    return Group(index=index, problem=problem, prompt=prompt, completions=comps, rewards=rewards)


def make_ctx(task, policy) -> StepContext:
    model, tok = policy
    return StepContext(step=0, seed=0, problems=task.problems(), task=task, group_size=4, prompts_per_step=4,
                       policy=ModelPolicy(model, tok))


def direct_logprobs(model, ids: list[int], n_answer: int) -> np.ndarray:
    """log pi(y_j | context, y_<j) for the last ``n_answer`` tokens of ``ids``, one unpadded forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    L = len(ids)
    return np.array([float(logp[L - n_answer - 1 + j, ids[L - n_answer + j]]) for j in range(n_answer)])


# ---------------------------------------------------------------------------------------- R3
def test_logprobs_equal_a_direct_teacher_forced_computation(task, policy):
    model, tok = policy
    g = make_group(task, tok, 0, ["1+2+0=3\n4+5+0=9\n#93", "9+9+0=18\n#7", "no answer", "#12"])
    proc = DROProcessor()
    (st,) = proc.statistics(make_ctx(task, policy), [g])
    y_text = task.format_answer(g.problem.answer)
    assert reference_answer_text(task, g.problem) == y_text and y_text.startswith("#")
    y_ids = tok.encode(y_text, add_special_tokens=False) + [tok.eos_token_id]
    assert st.answer_ids == y_ids
    prompt_ids = tok.encode(g.prompt, add_special_tokens=False)
    reasonings = ["1+2+0=3\n4+5+0=9\n", "9+9+0=18\n", "no answer", ""]  # no delimiter: all of it
    assert st.answer_start == [len(reasonings[0]), len(reasonings[1]), None, 0]
    direct = np.stack([direct_logprobs(model, prompt_ids + tok.encode(r, add_special_tokens=False) + y_ids,
                                       len(y_ids)) for r in reasonings])
    assert st.ell.shape == (4, len(y_ids))
    np.testing.assert_allclose(st.ell, direct, atol=2e-5)
    sigma = direct.std(axis=0)
    np.testing.assert_allclose(st.sigma, sigma, atol=2e-5)
    w = sigma / sigma.mean()
    np.testing.assert_allclose(st.weights, w, rtol=1e-4)
    np.testing.assert_allclose(st.r3, direct @ w, rtol=1e-4)
    np.testing.assert_allclose(st.r3_normalised, np.exp(direct @ w / w.sum()), rtol=1e-4)
    assert st.query_score == pytest.approx(sigma.max(), abs=2e-5)


def test_sigma_is_zero_when_all_rollouts_share_the_reasoning(task, policy):
    _, tok = policy
    g = make_group(task, tok, 1, ["3+4+0=7\n#7", "3+4+0=7\n#8", "3+4+0=7\n#77", "3+4+0=7\n"])
    # the last one has no delimiter: its reasoning is the same text (the final EOS is not reasoning)
    proc = DROProcessor(use_as="reward")
    (out,) = proc.process(make_ctx(task, policy), [g])
    st = proc.last_stats[0]
    assert np.abs(st.sigma).max() < 1e-6
    np.testing.assert_array_equal(st.weights, np.ones_like(st.weights))
    assert np.ptp(st.r3) < 1e-6
    assert np.ptp(out.rewards) < 1e-6 and not out.mixed  # no reasoning difference, no signal


def test_reflectivity_weights():
    np.testing.assert_allclose(reflectivity_weights([1.0, 3.0]), [0.5, 1.5])
    np.testing.assert_allclose(reflectivity_weights([1.0, 3.0], power=2), [0.2, 1.8])
    np.testing.assert_allclose(reflectivity_weights([1.0, 3.0], power=0), [1.0, 1.0])
    np.testing.assert_allclose(reflectivity_weights([0.0, 0.0]), [1.0, 1.0])


# ---------------------------------------------------------------------------------------- token weights
def test_token_weights_align_to_the_answer_tokens(task, policy):
    _, tok = policy
    texts = ["1+2+0=3\n#3", "5+5+0=10\n#1000", "#42", "never answers"]
    g = make_group(task, tok, 2, texts)
    proc = DROProcessor(use_as="token_weights")
    (out,) = proc.process(make_ctx(task, policy), [g])
    st = proc.last_stats[0]
    np.testing.assert_array_equal(out.rewards, g.rewards)  # rewards untouched
    assert out.token_weights is not None and len(out.token_weights) == 4
    for t, comp, tw, start in zip(texts, out.completions, out.token_weights, st.answer_start):
        ids = comp.token_ids
        assert tw.shape == (len(ids),)
        if "#" not in t:
            assert start is None
            np.testing.assert_array_equal(tw, np.ones(len(ids)))
            continue
        assert tok.decode([ids[start]]) == "#"  # the span starts at the completion's own delimiter
        np.testing.assert_array_equal(tw[:start], np.ones(start))  # reasoning tokens weigh 1
        span = np.ones(len(ids) - start)
        m = min(span.size, st.weights.size)
        span[:m] = st.weights[:m]
        span *= span.size / span.sum()
        np.testing.assert_allclose(tw[start:], span)
        assert tw[start:].mean() == pytest.approx(1.0)
    # the reference answer's weights are not uniform here, so the alignment is visible
    assert np.ptp(st.weights) > 0


def test_answer_span_weights_edge_cases():
    np.testing.assert_allclose(answer_span_weights(5, None, np.array([2.0, 0.0])), np.ones(5))
    np.testing.assert_allclose(answer_span_weights(4, 2, np.array([3.0, 1.0, 0.0])), [1, 1, 1.5, 0.5])
    np.testing.assert_allclose(answer_span_weights(4, 1, np.array([0.0, 0.0, 0.0])), np.ones(4))
    np.testing.assert_allclose(answer_span_weights(5, 2, np.array([2.0])), [1, 1, 1.5, 0.75, 0.75])


def test_reasoning_token_count_is_the_longest_prefix_within_the_text(policy):
    _, tok = policy
    ids = tok.encode("12+3=15\n#15", add_special_tokens=False)
    assert reasoning_token_count(tok, ids, 8) == 8
    assert reasoning_token_count(tok, ids, 0) == 0
    assert reasoning_token_count(tok, ids, 100) == len(ids)


# ---------------------------------------------------------------------------------------- reward
def test_reward_mode_replaces_or_mixes_and_keeps_the_verifier_counts(task, policy):
    _, tok = policy
    problem = task.problems()[3]
    right = "".join(s + "\n" for s in problem.solution) + "#" + problem.answer
    g = make_group(task, tok, 3, [right, "1+1+0=2\n#2", right, "#0"])
    assert g.successes == 2
    ctx = make_ctx(task, policy)
    full = DROProcessor(use_as="reward")
    (out,) = full.process(ctx, [g])
    st = full.last_stats[0]
    np.testing.assert_allclose(out.rewards, st.r3_normalised)
    assert np.all((out.rewards > 0) & (out.rewards <= 1))
    assert (out.pool_successes, out.pool_size) == (2.0, 4)
    half = DROProcessor(use_as="reward", reward_mix=0.5)
    (mixed,) = half.process(ctx, [g])
    np.testing.assert_allclose(mixed.rewards, 0.5 * g.rewards + 0.5 * st.r3_normalised, rtol=1e-6)
    np.testing.assert_array_equal(g.rewards, [1, 0, 1, 0])  # the input group is not modified
    assert g.token_weights is None and out.token_weights is None


# ---------------------------------------------------------------------------------------- filter
def test_query_filter_drops_exactly_the_lowest_sigma_groups(task, policy):
    _, tok = policy
    groups = [make_group(task, tok, 0, ["1+2+0=3\n#3", "9+9+1=19\n#8", "#5", "xyz\n#1"]),
              make_group(task, tok, 1, ["3+4+0=7\n#7"] * 4),  # identical reasoning: sigma = 0
              make_group(task, tok, 2, ["5+5+0=10\n#10", "#1", "2+2+0=4\n#4", "8+8+0=16\n#16"]),
              make_group(task, tok, 3, ["1+1+0=2\n#2", "1+1+0=2\n#3", "7+7+0=14\n#14", "#0"]),
              make_group(task, tok, 4, ["6+1+0=7\n#7", "#99", "#98", "#97"])]
    ctx = make_ctx(task, policy)
    proc = DROProcessor(use_as="none", filter_fraction=0.4)
    out = proc.process(ctx, groups)
    scores = np.array([s.sigma.max() for s in proc.last_stats])
    assert scores[1] < 1e-6
    lowest = sorted(np.argsort(scores, kind="stable")[:2].tolist())
    assert proc.last_dropped == lowest and 1 in lowest
    assert [g.index for g in out] == [i for i in range(5) if i not in lowest]  # order kept
    assert all(a is b for a, b in zip(out, [groups[i] for i in range(5) if i not in lowest]))  # use_as none
    # the filter keeps at least one group
    assert len(DROProcessor(use_as="none", filter_fraction=0.99).process(ctx, groups[:3])) == 1
    assert DROProcessor(filter_fraction=0.0).filter(proc.last_stats) == list(range(5))


def test_dro_needs_a_language_model():
    from rlcurate.sim.bridge import SimTrainer
    from rlcurate.sim.world import SoftmaxWorld

    tr = SimTrainer(SoftmaxWorld.make(n_prompts=32, seed=0), build_curator("dro"), prompts_per_step=4)
    with pytest.raises(ValueError, match="language-model policy"):
        tr.run(1)


# ---------------------------------------------------------------------------------------- trainer
@pytest.mark.parametrize("kwargs", [{}, {"use_as": "both", "filter_fraction": 0.5}])
def test_trainer_smoke(kwargs, tmp_path, policy):
    import copy

    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    model, tok = policy
    cfg = TrainConfig(strategy="dro", strategy_kwargs=kwargs, steps=2, prompts_per_step=4, group_size=4,
                      max_new_tokens=24, eval_every=0, out_dir=str(tmp_path), progress=False, save_model=False,
                      threads=1)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok,
                 task=ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8))
    tr.run()
    recs = [r for r in tr.metrics.read() if "rollouts" in r]
    assert len(recs) == 2
    want = 2 if kwargs.get("filter_fraction") else 4
    assert all(r["groups_trained"] == want for r in recs)
    # R3 rewards are continuous: the groups carry signal even when every verifier reward is 0
    assert all(r["samples_nonzero_adv"] > 0 for r in recs)
    proc = tr.curator.processors[0]
    assert len(proc.last_stats) == 4 and len(proc.last_dropped) == 4 - want


def test_insight_with_dro_updates_beliefs_from_the_verifier(tmp_path, policy):
    import copy

    from rlcurate.train import Trainer
    from rlcurate.train.config import TrainConfig

    model, tok = policy
    cfg = TrainConfig(strategy="insight+dro", steps=2, prompts_per_step=4, group_size=4, max_new_tokens=24,
                      eval_every=0, out_dir=str(tmp_path), progress=False, save_model=False, threads=1)
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok,
                 task=ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8))
    seen = []
    proc = tr.curator.processors[0]
    process = proc.process
    proc.process = lambda ctx, groups: seen.append((groups, process(ctx, groups))) or seen[-1][1]
    tr.run()
    b = tr.curator.selector.beliefs
    assert float((b.alpha + b.beta - 2).sum()) == pytest.approx(32.0)
    verifier_successes = sum(g.successes for before, _ in seen for g in before)
    assert float((b.alpha - 1).sum()) == pytest.approx(verifier_successes)
