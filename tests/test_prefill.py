"""The beginning a batch's prompts share, encoded once (rlcurate.models.prefill; appendix A3): the rollout
engine samples the same tokens and the trainer's scoring gives the same log-probabilities and
gradients as encoding every prompt whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.models import prefill
from rlcurate.policy.batching import TrainSample
from rlcurate.models.prefill import common_prefix_length, prefill_prompts
from rlcurate.policy.scoring import _can_share_prompts, forward_logprobs
from rlcurate.rollout import SamplingParams, TransformersEngine
from test_train_shared_prompts import _loss_and_grads

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

SYSTEM = "<|user|>You add and multiply; answer with the number.<|assistant|>Ready.<|user|>"
QUESTIONS = ["12+34=", "1+1=", "987*65=", "5*5=", "40+2="]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(dict(initializer_range=0.1), seed=0).eval()


@pytest.fixture
def prefix_calls(monkeypatch):
    """The number of prefix tokens each prefill actually encoded once (0: the prompts were encoded whole),
    read from the calls it made: a one-row call, then a call on top of that call's cache."""
    calls = []
    real = prefill.prefill_prompts

    def counting(module, prompts, *a, **k):
        seen = []

        def spy(**kw):
            seen.append((tuple(kw["input_ids"].shape), kw.get("past_key_values") is not None))
            return module(**kw)

        result = real(spy, prompts, *a, **k)
        shared = len(seen) == 2 and seen[0][0][0] == 1 < len(prompts) and seen[1][1]
        calls.append(seen[0][0][1] if shared else 0)
        return result

    monkeypatch.setattr("rlcurate.rollout.hf.prefill_prompts", counting)
    monkeypatch.setattr("rlcurate.policy.scoring.prefill_prompts", counting)
    return calls


def test_common_prefix_length_leaves_each_prompt_a_token():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # equal prompts keep their last token
    assert common_prefix_length([[1, 2, 3], [1, 2]]) == 1
    assert common_prefix_length([[7], [7, 8]]) == 0
    assert common_prefix_length([[4, 5]]) == 1 and common_prefix_length([]) == 0


def test_prefill_gives_the_last_hidden_states_of_whole_prompts(model, tok):
    prompts = [tok.encode(SYSTEM + q, add_special_tokens=False) for q in QUESTIONS]
    decoder = model.model
    with torch.no_grad():
        shared, attn, pos = prefill_prompts(decoder, prompts, tok.pad_token_id, "cpu")
        whole, attn0, _ = prefill_prompts(decoder, prompts, tok.pad_token_id, "cpu", min_shared=10**9)
    C = common_prefix_length(prompts)
    assert C == len(tok.encode(SYSTEM, add_special_tokens=False)) >= prefill.MIN_SHARED_PREFIX
    assert attn.shape[1] == C + max(len(p) - C for p in prompts) and attn0.shape[1] == max(len(p) for p in prompts)
    assert torch.equal(attn.sum(1), torch.tensor([len(p) for p in prompts]))  # every prompt token, once
    assert torch.equal(pos[:, -1], torch.tensor([len(p) - 1 for p in prompts]))
    for u, p in enumerate(prompts):
        alone = decoder(input_ids=torch.tensor([p])).last_hidden_state[0, -1]
        assert torch.allclose(shared.last_hidden_state[u, -1], alone, atol=1e-5)
        assert torch.allclose(whole.last_hidden_state[u, -1], alone, atol=1e-5)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_engine_samples_the_same_tokens_with_a_shared_prefix(model, tok, monkeypatch, prefix_calls, decode):
    prompts = [SYSTEM + q for q in QUESTIONS]
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine = TransformersEngine(model, tok, decode=decode, token_budget=400)  # several batches
    shared = engine.generate(prompts, 3, params, seed=5)
    assert prefix_calls and all(c == common_prefix_length([tok.encode(p, add_special_tokens=False) for p in prompts])
                                for c in prefix_calls)
    monkeypatch.setattr(prefill, "MIN_SHARED_PREFIX", 10**9)
    whole = engine.generate(prompts, 3, params, seed=5)
    assert [[c.token_ids for c in g] for g in shared] == [[c.token_ids for c in g] for g in whole]
    diff = max(abs(x - y) for ga, gb in zip(shared, whole) for a, b in zip(ga, gb)
               for x, y in zip(a.logprobs, b.logprobs))
    assert diff < 1e-4


@pytest.mark.parametrize("G, max_len", [(1, 6), (3, 6), (3, 1)])  # distinct prompts; groups; one-token completions
def test_scoring_with_a_shared_prefix_gives_the_same_logprobs_and_gradients(tok, prefix_calls, G, max_len):
    model = build_tiny_model(dict(initializer_range=0.1), seed=1).train()
    rng = np.random.default_rng(G + max_len)
    # the last question is a strict prefix of the first: its remainder is shorter than the others'
    prompts = [tok.encode(SYSTEM + q, add_special_tokens=False) for q in QUESTIONS + ["12+"]]
    samples = [TrainSample(list(p), rng.integers(4, 40, size=rng.integers(1, max_len + 1)).tolist(),
                           float(rng.normal())) for _ in range(G) for p in prompts]
    assert _can_share_prompts(model, samples)
    a = _loss_and_grads(model, samples, tok.pad_token_id, share=False)
    b = _loss_and_grads(model, samples, tok.pad_token_id, share=True)
    assert prefix_calls == [common_prefix_length(prompts)]  # the shared path ran, once
    assert torch.equal(a[1], b[1])
    assert torch.allclose(a[0][a[1]], b[0][b[1]], atol=1e-5)
    assert torch.allclose(a[2][a[1]], b[2][b[1]], atol=1e-5)
    assert a[3] == pytest.approx(b[3], abs=1e-6)
    for ga, gb in zip(a[4], b[4]):  # float32 rounding of sums in a different order: relative to the tensor
        assert (ga - gb).norm() <= 1e-5 * ga.norm() + 1e-8


def test_activation_checkpointing_skips_the_shared_path(tok, prefix_calls):
    """Checkpointed layers keep no cache in training, so nothing is encoded for a cache that never comes."""
    model = build_tiny_model(dict(initializer_range=0.1), seed=1).train()
    prompts = [tok.encode(SYSTEM + q, add_special_tokens=False) for q in QUESTIONS]
    samples = [TrainSample(list(p), [5, 6], 1.0) for p in prompts for _ in range(2)]
    plain = _loss_and_grads(model, samples, tok.pad_token_id, share=False)
    model.gradient_checkpointing_enable()
    assert not _can_share_prompts(model, samples)
    checkpointed = _loss_and_grads(model, samples, tok.pad_token_id, share=True)
    assert prefix_calls == []
    assert checkpointed[3] == pytest.approx(plain[3], abs=1e-6)


def test_distinct_prompts_without_a_long_common_prefix_are_not_shared(model, tok):
    short = [TrainSample(tok.encode("<|user|>" + q, add_special_tokens=False), [5], 0.0) for q in QUESTIONS]
    assert not _can_share_prompts(model, short)
