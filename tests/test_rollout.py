"""Tests of the rollout engines (chapter 4): counts, determinism, exact log-probs, padding, batching,
stopping and input checks, on a seeded random tiny Qwen2 model with a character-level tokenizer."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.rollout import Completion, SamplingParams, TransformersEngine, VLLMEngine
from rlcurate.rollout.hf import plan_batches
from rlcurate.rollout.sampling import row_keys, sample_next, step_uniforms, truncate_logits, uniforms


def char_tokenizer():
    """The tiny model's character-level tokenizer (one token per character, eos ``<|endoftext|>`` = 1)."""
    return build_tiny_tokenizer()


def tiny_model(seed: int = 0):
    """A random tiny Qwen2 (about 1M parameters); initializer_range 0.1 makes its next-token
    distributions peaked enough that greedy decoding meets no near-ties."""
    return build_tiny_model(dict(initializer_range=0.1), seed=seed).eval()


PROMPTS = ["<|user|>12+34=<|assistant|>", "1+1=", "<|user|>987*65=<|assistant|>", "a"]


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def engine(model, tok):
    return TransformersEngine(model, tok)


def ids(result):
    return [[c.token_ids for c in group] for group in result]


def forward_logprobs(model, prompt_ids, token_ids, temperature=1.0):
    """log softmax(logits / T) of ``token_ids`` after ``prompt_ids``, from one unpadded forward pass."""
    x = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = model(x).logits[0, len(prompt_ids) - 1:-1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp[torch.arange(len(token_ids)), torch.tensor(token_ids)].numpy()


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(stop=("",)), "stop"),
])
def test_sampling_params_reject_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_stop():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize("prompts, n, seed, name", [
    (["1+1="], -1, 0, "n"), (["1+1=", "2"], [1], 0, "n"), (["1+1="], [1.5], 0, "n"),
    (["1+1="], 1, -3, "seed"), ("1+1=", 1, 0, "prompts"), ([[]], 1, 0, r"prompts\[0\]"),
    ([3.5], 1, 0, r"prompts\[0\]"), ([[5, 99]], 1, 0, r"prompts\[0\]"), ([""], 1, 0, r"prompts\[0\]"),
])
def test_generate_rejects_bad_input(engine, prompts, n, seed, name):
    with pytest.raises(ValueError, match=name):
        engine.generate(prompts, n, SamplingParams(max_new_tokens=2), seed=seed)


def test_empty_prompt_list(engine):
    assert engine.generate([], 4, SamplingParams()) == []


def test_engine_rejects_bad_budget(model, tok):
    with pytest.raises(ValueError, match="token_budget"):
        TransformersEngine(model, tok, token_budget=0)


# ------------------------------------------------------------------ shapes, determinism
def test_counts_scalar_and_per_prompt(engine, tok):
    params = SamplingParams(max_new_tokens=6)
    out = engine.generate(PROMPTS, 3, params, seed=1)
    assert [len(g) for g in out] == [3] * len(PROMPTS)
    out = engine.generate(PROMPTS, [2, 0, 5, 1], params, seed=1)
    assert [len(g) for g in out] == [2, 0, 5, 1]
    for i, group in enumerate(out):
        for j, c in enumerate(group):
            assert isinstance(c, Completion)
            assert (c.prompt_index, c.sample_index) == (i, j)
            assert c.prompt_token_ids == tok.encode(PROMPTS[i], add_special_tokens=False)
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 6
            assert c.finish_reason in ("stop", "length")
            assert (c.finish_reason == "length") == (len(c.token_ids) == 6 and c.token_ids[-1] != 1)
    assert engine.generate(PROMPTS, 0, params) == [[] for _ in PROMPTS]


def test_token_id_prompts_equal_text_prompts(engine, tok):
    params = SamplingParams(max_new_tokens=5)
    as_ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    assert ids(engine.generate(as_ids, 2, params, seed=3)) == ids(engine.generate(PROMPTS, 2, params, seed=3))
    assert ids(engine.generate([np.array(as_ids[0])], 2, params, seed=3))[0] == ids(
        engine.generate(PROMPTS[:1], 2, params, seed=3))[0]


def test_same_seed_same_output_and_seeds_differ(engine):
    params = SamplingParams(max_new_tokens=8)
    a = engine.generate(PROMPTS, 4, params, seed=7)
    b = engine.generate(PROMPTS, 4, params, seed=7)
    c = engine.generate(PROMPTS, 4, params, seed=8)
    assert a == b
    assert ids(a) != ids(c)
    # samples of one prompt are not copies of each other
    assert len({tuple(c.token_ids) for c in a[0]}) > 1


def test_samples_do_not_depend_on_other_rows(engine):
    params = SamplingParams(max_new_tokens=8)
    full = engine.generate(PROMPTS, [3, 1, 2, 2], params, seed=5)
    fewer = engine.generate(PROMPTS, [2, 0, 2, 1], params, seed=5)
    for g_full, g_fewer in zip(ids(full), ids(fewer)):
        assert g_full[: len(g_fewer)] == g_fewer


# ------------------------------------------------------------------ log-probs
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_forward_pass(engine, model, temperature):
    out = engine.generate(PROMPTS, 3, SamplingParams(temperature=temperature, max_new_tokens=10), seed=2)
    for group in out:
        for c in group:
            want = forward_logprobs(model, c.prompt_token_ids, c.token_ids, temperature)
            np.testing.assert_allclose(c.logprobs, want, atol=1e-5, rtol=0)


def test_truncated_sampling_keeps_untruncated_logprobs(engine, model):
    out = engine.generate(PROMPTS, 4, SamplingParams(top_k=3, top_p=0.9, max_new_tokens=8), seed=4)
    for group in out:
        for c in group:
            x = torch.tensor([c.prompt_token_ids + c.token_ids])
            with torch.no_grad():
                logits = model(x).logits[0, len(c.prompt_token_ids) - 1:-1]
            rank = (logits > logits[torch.arange(len(c.token_ids)), c.token_ids][:, None]).sum(-1)
            assert (rank < 3).all(), "a token outside the top-k was sampled"
            np.testing.assert_allclose(c.logprobs, forward_logprobs(model, c.prompt_token_ids, c.token_ids),
                                       atol=1e-5, rtol=0)


def test_greedy_logprobs_are_model_logprobs(engine, model):
    out = engine.generate(PROMPTS, 1, SamplingParams(temperature=0, max_new_tokens=10))
    for (c,) in out:
        np.testing.assert_allclose(c.logprobs, forward_logprobs(model, c.prompt_token_ids, c.token_ids),
                                   atol=1e-5, rtol=0)


def test_first_token_frequencies_match_the_model(engine, model, tok):
    prompt = tok.encode(PROMPTS[0], add_special_tokens=False)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
    out = engine.generate([prompt], 3000, SamplingParams(max_new_tokens=1), seed=11)[0]
    freq = np.bincount([c.token_ids[0] for c in out], minlength=len(p)) / len(out)
    assert 0.5 * np.abs(freq - p).sum() < 0.05


def test_generation_config_does_not_leak(model, tok):
    params = SamplingParams(max_new_tokens=8)
    before = TransformersEngine(model, tok).generate(PROMPTS, 3, params, seed=9)
    cfg = model.generation_config
    saved = (cfg.top_k, cfg.temperature, cfg.repetition_penalty, cfg.do_sample)
    try:
        cfg.top_k, cfg.temperature, cfg.repetition_penalty, cfg.do_sample = 1, 0.1, 5.0, True
        after = TransformersEngine(model, tok).generate(PROMPTS, 3, params, seed=9)
    finally:
        cfg.top_k, cfg.temperature, cfg.repetition_penalty, cfg.do_sample = saved
    assert before == after


# ------------------------------------------------------------------ padding and batching
def test_left_padding_matches_unbatched_greedy(engine):
    params = SamplingParams(temperature=0, max_new_tokens=16)
    batched = engine.generate(PROMPTS, 1, params)
    for i, p in enumerate(PROMPTS):
        alone = engine.generate([p], 1, params)[0][0]
        assert batched[i][0].token_ids == alone.token_ids
        np.testing.assert_allclose(batched[i][0].logprobs, alone.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_token_budget_batching_matches_one_batch(model, tok, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=12)
    small = TransformersEngine(model, tok, token_budget=60)  # a few rows per batch
    big = TransformersEngine(model, tok, token_budget=10**6)
    assert ids(small.generate(PROMPTS, [3, 2, 4, 1], params, seed=3)) == ids(
        big.generate(PROMPTS, [3, 2, 4, 1], params, seed=3))


def test_pruning_finished_rows_changes_nothing(model, tok):
    params = SamplingParams(max_new_tokens=16)
    a = TransformersEngine(model, tok, prune_finished=True).generate(PROMPTS, 6, params, seed=1)
    b = TransformersEngine(model, tok, prune_finished=False).generate(PROMPTS, 6, params, seed=1)
    assert ids(a) == ids(b)
    assert any(c.finish_reason == "stop" for g in a for c in g), "test needs some early stops"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 9)), max_size=12),
       st.integers(1, 30), st.integers(1, 400))
def test_plan_batches_respects_budget(prompts, max_new, budget):
    lengths, counts = [p[0] for p in prompts], [p[1] for p in prompts]
    batches = plan_batches(lengths, counts, max_new_tokens=max_new, token_budget=budget)
    rows = [r for b in batches for r in b]
    assert sorted(rows) == sorted((i, j) for i, c in enumerate(counts) for j in range(c))
    for b in batches:
        assert b and (len(b) * (max(lengths[i] for i, _ in b) + max_new) <= budget or len(b) == 1)


def test_plan_batches_gives_an_oversized_row_its_own_batch():
    assert plan_batches([500], [2], 10, 100) == [[(0, 0)], [(0, 1)]]
    assert plan_batches([5, 3], [2, 2], 5, 10**6) == [[(0, 0), (0, 1), (1, 0), (1, 1)]]


# ------------------------------------------------------------------ stopping
def test_eos_stops_and_is_kept_in_tokens_not_text(model, tok):
    params = SamplingParams(temperature=0, max_new_tokens=16)
    ref = TransformersEngine(model, tok, eos_token_ids=[]).generate(PROMPTS[:1], 1, params)[0][0]
    assert ref.finish_reason == "length"
    eos = ref.token_ids[3]
    first = ref.token_ids.index(eos)
    c = TransformersEngine(model, tok, eos_token_ids=[eos]).generate(PROMPTS[:1], 1, params)[0][0]
    assert c.finish_reason == "stop"
    assert c.token_ids == ref.token_ids[: first + 1]
    assert c.text == tok.decode(ref.token_ids[:first])
    assert len(c.logprobs) == len(c.token_ids)


def test_stop_string_is_included_and_ends_the_text(model, tok):
    params = SamplingParams(temperature=0, max_new_tokens=16)
    engine = TransformersEngine(model, tok, eos_token_ids=[])
    ref = engine.generate(PROMPTS[:1], 1, params)[0][0]
    stop = ref.text[3:5]
    end = ref.text.find(stop) + len(stop)
    c = engine.generate(PROMPTS[:1], 1, SamplingParams(temperature=0, max_new_tokens=16, stop=(stop, "#")))[0][0]
    assert c.finish_reason == "stop"
    assert c.text == ref.text[:end] and c.text.endswith(stop)
    assert c.token_ids == ref.token_ids[: len(c.token_ids)]
    assert tok.decode(c.token_ids).startswith(c.text)


def test_engine_leaves_training_mode_alone(model, tok):
    model.train()
    try:
        TransformersEngine(model, tok).generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2), progress=True)
        assert model.training
    finally:
        model.eval()


# ------------------------------------------------------------------ sampling primitives
def test_engine_draws_token_t_of_sample_j_of_prompt_i_with_uniforms_i_j_t(engine, model):
    """The engine's contract: token t of sample j of prompt i is the inverse CDF at uniforms(seed, i, j, t),
    here replayed one row at a time with an unbatched forward pass per token."""
    seed, params = 9, SamplingParams(temperature=1.0, max_new_tokens=6)
    out = engine.generate(PROMPTS, 2, params, seed=seed)
    for i, group in enumerate(out):
        for j, c in enumerate(group):
            x, replay = list(c.prompt_token_ids), []
            for t in range(len(c.token_ids)):
                with torch.no_grad():
                    logits = model(torch.tensor([x])).logits[:, -1, :]
                token, _ = sample_next(logits, 1.0, 0, 1.0, uniforms(seed, [i], [j], t))
                replay.append(int(token))
                x.append(int(token))
            assert replay == c.token_ids, (i, j)


def test_uniforms_are_keyed_and_uniform():
    u = uniforms(0, np.arange(20000) % 100, np.arange(20000) // 100, 3)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and len(np.unique(u)) == len(u)
    assert np.array_equal(u, uniforms(0, np.arange(20000) % 100, np.arange(20000) // 100, 3))
    assert not np.array_equal(u, uniforms(1, np.arange(20000) % 100, np.arange(20000) // 100, 3))
    assert uniforms(0, [1], [2], 3)[0] != uniforms(0, [2], [1], 3)[0]
    # one row's whole stream at once (the replay's sampler check) is the same bits as token by token
    key = row_keys(7, [4], [5])
    stream = step_uniforms(key, np.arange(50, dtype=np.uint64))
    assert np.array_equal(stream, np.concatenate([step_uniforms(key, t) for t in range(50)]))


def test_truncate_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    keep = lambda out: torch.isfinite(out)[0].tolist()  # noqa: E731
    assert keep(truncate_logits(logits, 2, 1.0)) == [True, True, False, False]
    assert keep(truncate_logits(logits, 0, 0.74)) == [True, True, False, False]
    assert keep(truncate_logits(logits, 0, 0.76)) == [True, True, True, False]
    assert keep(truncate_logits(logits, 0, 0.1)) == [True, False, False, False]
    # top-p acts on the distribution renormalised after top-k: 0.5/0.9 > 0.55
    assert keep(truncate_logits(logits, 3, 0.55)) == [True, False, False, False]
    assert keep(truncate_logits(logits, 3, 0.56)) == [True, True, False, False]


def test_sample_next_inverse_cdf():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]] * 4))
    tokens, lp = sample_next(logits, 1.0, 0, 1.0, [0.0, 0.49, 0.51, 0.95])
    assert tokens.tolist() == [0, 0, 1, 3]
    np.testing.assert_allclose(lp.numpy(), np.log([0.5, 0.5, 0.25, 0.1]), rtol=1e-6)
    tokens, _ = sample_next(logits, 1.0, 2, 1.0, [0.0, 0.5, 0.7, 0.999])
    assert tokens.tolist() == [0, 0, 1, 1]


# ------------------------------------------------------------------ vLLM guard
def test_vllm_engine_import_guard():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"vLLM.*pip install"):
            VLLMEngine("some/model")
    else:  # pragma: no cover - only on a GPU box with vLLM
        pytest.skip("vLLM is installed; the import guard is not exercised")


def test_vllm_engine_maps_params_and_parses_outputs(monkeypatch):
    """VLLMEngine against a stand-in ``vllm`` module: what it asks for and how it reads the answer."""
    calls = {}

    class FakeSamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class FakeLLM:
        def __init__(self, model, **kw):
            calls["llm"] = dict(model=model, **kw)

        def generate(self, requests, sps, use_tqdm=False):
            calls["requests"], calls["sps"] = requests, [s.kw for s in sps]
            outs = []
            for req, sp in zip(requests, sps):
                seqs = [types.SimpleNamespace(token_ids=[7, 8 + j], text=f"t{j}", finish_reason="length",
                                              logprobs=[{7: types.SimpleNamespace(logprob=-0.5)},
                                                        {8 + j: types.SimpleNamespace(logprob=-1.5)}])
                        for j in range(sp.kw["n"])]
                outs.append(types.SimpleNamespace(prompt_token_ids=[1, 2], outputs=seqs))
            return outs

    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    engine = VLLMEngine("some/model", gpu_memory_utilization=0.5)
    assert calls["llm"] == dict(model="some/model", gpu_memory_utilization=0.5,
                                logprobs_mode="processed_logprobs")
    out = engine.generate(["a", [5, 6]], [2, 0], SamplingParams(temperature=0.8, top_k=0, stop=("\n",)), seed=3)
    assert calls["requests"] == ["a"]
    sp = calls["sps"][0]
    assert (sp["n"], sp["top_k"], sp["temperature"], sp["stop"], sp["logprobs"]) == (2, -1, 0.8, ["\n"], 1)
    assert sp["include_stop_str_in_output"] and sp["repetition_penalty"] == 1.0
    assert [len(g) for g in out] == [2, 0]
    assert out[0][1].token_ids == [7, 9] and out[0][1].logprobs == [-0.5, -1.5] and out[0][1].sample_index == 1


def test_prompt_seeds_do_not_collide_across_seed_and_index():
    from rlcurate.rollout import prompt_seed

    seeds = {prompt_seed(s, i) for s in range(64) for i in range(64)}
    assert len(seeds) == 64 * 64
    assert prompt_seed(0, 1) != prompt_seed(1, 0)
