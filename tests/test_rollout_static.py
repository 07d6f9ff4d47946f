"""The rollout engine's fixed-shape decode paths (``decode="static"``, ``"captured"``, ``"compiled"``;
:mod:`rlcurate.rollout.fixed_shape`): the same tokens as the default growing cache, whatever the batching,
under the trainer's autocast too; one KV-cache dtype for the engine and the planner; a compiled step
compiled once per bucket of rows; stop strings found without decoding every row at every step (issue #31,
appendix A1)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcurate.errors import UserError
from rlcurate.rollout import SamplingParams, TransformersEngine
from rlcurate.tasks.arithmetic import ArithmeticTask

REPO = Path(__file__).resolve().parents[1]
SPREAD = REPO / "data" / "tiny" / "spread"


@pytest.fixture(scope="module")
def tiny():
    from rlcurate.models import load_policy

    torch.set_num_threads(1)
    model, tok = load_policy(str(SPREAD), device="cpu", dtype="fp32")
    task = ArithmeticTask()
    prompts = [task.render(p, tok) for p in task.problems("test")[:12]]
    return model, tok, prompts


def _tokens(engine, prompts, n, params, seed=3):
    out = engine.generate(prompts, n, params, seed=seed)
    return [[c.token_ids for c in g] for g in out], [[c.logprobs for c in g] for g in out], out


def test_device_uniforms_are_the_host_stream_bit_for_bit():
    from rlcurate.rollout.fixed_shape import keys_as_int64, step_uniforms_device
    from rlcurate.rollout.sampling import row_keys, step_uniforms

    rng = np.random.default_rng(0)
    keys = row_keys(2**63 + 12345, rng.integers(0, 10**6, 64), rng.integers(0, 64, 64))
    for t in (0, 1, 7, 255, 2**31 + 5):
        host = step_uniforms(keys, t)
        dev = step_uniforms_device(keys_as_int64(keys), torch.tensor([t])).numpy()
        assert np.array_equal(host, dev)


@pytest.mark.parametrize("decode", ["static", "captured"])
@pytest.mark.parametrize("budget", [10**6, 700])  # one batch; several batches of mixed prompt lengths
def test_fixed_shape_decoding_samples_the_same_tokens_as_the_growing_cache(tiny, budget, decode):
    model, tok, prompts = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    a, lpa, outa = _tokens(TransformersEngine(model, tok, token_budget=budget), prompts, 4, params)
    b, lpb, outb = _tokens(TransformersEngine(model, tok, token_budget=budget, decode=decode), prompts, 4, params)
    assert a == b
    diff = max(abs(x - y) for ga, gb in zip(lpa, lpb) for ra, rb in zip(ga, gb) for x, y in zip(ra, rb))
    assert diff < 1e-4
    # natural stopping: completions end at EOS, and the texts and finish reasons agree
    assert [[c.text for c in g] for g in outa] == [[c.text for c in g] for g in outb]
    assert [[c.finish_reason for c in g] for g in outa] == [[c.finish_reason for c in g] for g in outb]
    assert any(c.finish_reason == "stop" for g in outb for c in g)


@pytest.mark.parametrize("sync_every", [1, 8, 64])
def test_fixed_shape_decoding_honours_stop_strings_and_forced_lengths(tiny, sync_every):
    """A stop string found at a look every ``sync_every`` steps cuts the completion where looking after
    every token would have: the same tokens, texts and finish reasons as the growing cache."""
    model, tok, prompts = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=24, stop=["=1", "#"])
    a, _, outa = _tokens(TransformersEngine(model, tok), prompts[:4], 3, params)
    b, _, outb = _tokens(TransformersEngine(model, tok, decode="static", sync_every=sync_every), prompts[:4], 3,
                         params)
    assert a == b
    assert [[(c.text, c.finish_reason) for c in g] for g in outa] == [[(c.text, c.finish_reason) for c in g]
                                                                        for g in outb]
    assert any(c.finish_reason == "stop" and c.text.endswith("=1") for g in outa for c in g)
    forced = SamplingParams(temperature=1.0, max_new_tokens=12)
    c, _, _ = _tokens(TransformersEngine(model, tok, decode="static", eos_token_ids=()), prompts[:3], 2, forced)
    assert all(len(t) == 12 for g in c for t in g)


def test_stop_scanner_finds_the_first_stop_as_decoding_every_prefix_would(tiny):
    from rlcurate.rollout.base import find_stop
    from rlcurate.rollout.hf import StopScanner

    _, tok, _ = tiny
    rng = random.Random(0)
    alphabet = [tok.encode(ch, add_special_tokens=False)[0] for ch in "012+=# \n"]
    for stop in (["\n"], ["=1", "##"], ["+2+"]):
        scanner = StopScanner(tok, stop)
        rows = [[rng.choice(alphabet) for _ in range(rng.randint(1, 40))] for _ in range(200)]
        expected = {}
        for k, row in enumerate(rows):
            for s in range(len(row)):
                end = find_stop(tok.decode(row[: s + 1]), stop)
                if end >= 0:
                    expected[k] = (s, end)
                    break
        # looked at in chunks of 5 steps, as the fixed-shape loop does
        found, done = {}, set()
        for start in range(0, 40, 5):
            live = [k for k in range(len(rows)) if k not in done]
            hits = scanner.first_stops([rows[k] for k in live], [start] * len(live),
                                       [min(start + 5, len(rows[k])) for k in live])
            for i, hit in hits.items():
                found[live[i]] = hit
                done.add(live[i])
        assert found == expected
        assert expected  # the random rows do hit the stop strings


def test_decode_options_are_checked():
    from rlcurate.train import TrainConfig

    with pytest.raises(ValueError, match="decode must be one of dynamic, static, captured, compiled"):
        TransformersEngine(torch.nn.Embedding(4, 2), None, decode="paged")
    with pytest.raises(ValueError, match="sync_every must be a positive integer"):
        TransformersEngine(torch.nn.Embedding(4, 2), None, sync_every=0)
    with pytest.raises(UserError, match="decode must be one of dynamic, static, captured, compiled"):
        TrainConfig(decode="fast")


@pytest.mark.parametrize("decode", ["static", "captured", "compiled"])
def test_every_decode_path_works_under_the_trainers_autocast(tiny, decode):
    """fp32 weights under bf16 autocast, as the trainer generates on a GPU (reproduced on the CPU): the
    fixed-shape paths used to size their cache from the prefill's fp32 keys and fail at the first bf16
    write (issue #31). Now every path keeps one KV-cache dtype, autocast's, the one the planner charges,
    and samples the tokens of the growing cache. (``compiled`` with dynamo's eager backend: the graph
    capture and guards without generating code.)"""
    from rlcurate.plan import KV_DTYPE_BYTES
    from rlcurate.rollout.fixed_shape import kv_cache_dtype

    model, tok, prompts = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    engine = TransformersEngine(model, tok, decode=decode, token_budget=700)
    engine.fixed.compile_backend = "eager"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, _, _ = _tokens(TransformersEngine(model, tok, token_budget=700), prompts[:6], 3, params)
        b, _, _ = _tokens(engine, prompts[:6], 3, params)
        assert kv_cache_dtype(model, "cpu") == torch.bfloat16
    # bf16 rounding differs between the paths' kernel shapes (the fixed-shape attention spans the whole
    # cache, masked), which can flip a near-tie on some processor: most completions, not all, must agree
    rows_a, rows_b = [t for g in a for t in g], [t for g in b for t in g]
    assert sum(x == y for x, y in zip(rows_a, rows_b)) >= 0.75 * len(rows_a)
    assert engine.fixed.cache.keys[0].dtype == torch.bfloat16
    assert engine.fixed.cache.keys[0].element_size() == KV_DTYPE_BYTES["auto"] == KV_DTYPE_BYTES["bf16"]
    assert kv_cache_dtype(model, "cpu") == torch.float32 and KV_DTYPE_BYTES["fp32"] == 4


def test_the_growing_cache_keeps_autocasts_dtype(tiny):
    """Under autocast the rotary embedding returns fp32 keys; the growing cache stores them (and every
    later column) in bf16, which changes no number since attention computes in bf16."""
    from rlcurate.models.prefill import prefill_prompts
    from rlcurate.rollout.hf import _store_cache_as

    model, tok, prompts = tiny
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts[:2]]
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, attn, pos = prefill_prompts(model, ids, tok.pad_token_id or 0, "cpu")
        past = out.past_key_values
        assert past.layers[0].keys.dtype == torch.float32  # what the layers hold without the cast
        _store_cache_as(past, torch.bfloat16)
        attn = torch.cat([attn, attn.new_ones((2, 1))], dim=1)
        model(input_ids=torch.tensor([[5], [6]]), attention_mask=attn, position_ids=pos[:, -1:] + 1,
              past_key_values=past, use_cache=True)
    assert {(layer.keys.dtype, layer.values.dtype) for layer in past.layers} == {(torch.bfloat16, torch.bfloat16)}
    assert past.layers[0].keys.shape[2] == attn.shape[1]


def test_a_compiled_step_compiles_once_per_bucket_of_rows(tiny):
    """Batches of 3, 5 and 7 rows run in the bucket of 8 and reuse its compiled step (the graph count does
    not grow); 12 rows open the bucket of 16, compiled once more. Counted by a dynamo backend that records
    each graph it is handed."""
    model, tok, prompts = tiny
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    engine = TransformersEngine(model, tok, decode="compiled")
    engine.fixed.compile_backend = counting_backend
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    seen = []
    for n_prompts, n in ((3, 1), (5, 1), (7, 1), (4, 3)):
        engine.generate(prompts[:n_prompts], n, params, seed=0)
        seen.append(len(graphs))
    assert seen[0] > 0 and seen[0] == seen[1] == seen[2] < seen[3]
    # the 16-row bucket outgrew the storage: it was reallocated once, and the 8-row step dropped with it
    assert [k.rows for k in engine.fixed.steps] == [16] and engine.fixed.cache.rows == 16


def test_trainer_with_the_static_cache_takes_the_same_step(tiny, tmp_path):
    from rlcurate.train import TrainConfig, Trainer

    model, tok, _ = tiny
    losses = {}
    for decode in ("dynamic", "static"):  # (captured is static on a CPU)
        cfg = TrainConfig(model=str(SPREAD), steps=1, prompts_per_step=4, group_size=4, max_new_tokens=40,
                          eval_every=0, checkpoint_every=0, save_model=False, progress=False, threads=1,
                          out_dir=str(tmp_path / decode), decode=decode)
        import copy

        trainer = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok)
        rec = trainer.train_step(0)
        losses[decode] = (rec["loss"], rec["reward_mean"], rec["generated_tokens"])
    assert losses["dynamic"][1:] == losses["static"][1:]
    assert abs(losses["dynamic"][0] - losses["static"][0]) < 1e-5


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
                    reason="torch.compile on the CPU needs a C compiler")
@pytest.mark.skipif(bool(os.environ.get("ATEN_CPU_CAPABILITY")),
                    reason="an emulated processor: torch.compile's generated CPU code does not follow "
                           "ATEN_CPU_CAPABILITY (under avx2 on an AVX-512 Xeon the compiled decode returned "
                           "token 63 at every step, 2026-11-25; issue #31)")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit inside torch.compile
def test_compiled_decode_samples_the_same_tokens(tiny):
    """``decode="compiled"`` (torch.compile of the whole step, inductor; CUDA graphs on a GPU): the same
    tokens, on the CPU here (compiling takes tens of seconds once)."""
    model, tok, prompts = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    a, _, _ = _tokens(TransformersEngine(model, tok), prompts[:2], 2, params)
    b, _, _ = _tokens(TransformersEngine(model, tok, decode="compiled"), prompts[:2], 2, params)
    assert a == b


def test_a_bf16_rollout_copy_follows_the_trained_weights(tiny, tmp_path):
    """``rollout_dtype=torch.bfloat16`` (the trainer's ``rollout_weights: bf16``): the engine decodes with a
    bf16 copy of the parameters (buffers such as the rotary frequencies untouched), refreshed from the
    trained model at every ``generate``: after the trained weights move, it samples what a fresh bf16 copy
    of the moved weights samples."""
    import copy

    from rlcurate.rollout.hf import _parameters_copy
    from rlcurate.train import TrainConfig, Trainer

    model, tok, prompts = tiny
    trained = copy.deepcopy(model)
    engine = TransformersEngine(trained, tok, decode="static", rollout_dtype=torch.bfloat16)
    assert engine.model is not trained and {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in engine.model.buffers()} == {b.dtype for b in trained.buffers()}
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    before, _, _ = _tokens(engine, prompts[:4], 2, params)
    with torch.no_grad():  # an "optimizer step"
        gen = torch.Generator().manual_seed(0)
        for p in trained.parameters():
            p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    after, _, _ = _tokens(engine, prompts[:4], 2, params)
    fresh, _, _ = _tokens(TransformersEngine(_parameters_copy(trained, torch.bfloat16), tok, decode="static"),
                          prompts[:4], 2, params)
    assert after == fresh and after != before

    cfg = TrainConfig(model=str(SPREAD), steps=1, prompts_per_step=4, group_size=4, max_new_tokens=16,
                      eval_every=0, checkpoint_every=0, save_model=False, progress=False, threads=1,
                      out_dir=str(tmp_path), rollout_weights="bf16")
    trainer = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok)
    rec = trainer.train_step(0)
    assert rec["generated_tokens"] > 0
    trainer.engine.refresh_weights()
    assert all(torch.equal(d, s.to(torch.bfloat16))
               for d, s in zip(trainer.engine.model.parameters(), trainer.model.parameters()))
    with pytest.raises(UserError, match="rollout_weights must be one of train, bf16"):
        TrainConfig(rollout_weights="fp16")


@pytest.mark.parametrize("arch", ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen3-0.6B"])
def test_the_gpu_configs_architectures_decode_the_same_tokens_captured(tiny, arch):
    """The GPU configurations decode with ``decode: captured``: each of their architectures (two layers,
    the real attention shapes: heads, grouped key-value heads, head size, Qwen3's query and key norms;
    random fp32 weights, a 64-token vocabulary) samples the growing cache's tokens on the fixed-shape path."""
    from transformers import AutoModelForCausalLM

    from rlcurate.models.architectures import hf_config

    _, tok, prompts = tiny
    torch.manual_seed(0)
    config = hf_config(arch, num_hidden_layers=2, intermediate_size=128, vocab_size=64,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    a, lpa, _ = _tokens(TransformersEngine(model, tok, eos_token_ids=()), prompts[:3], 3, params)
    b, lpb, _ = _tokens(TransformersEngine(model, tok, eos_token_ids=(), decode="captured"), prompts[:3], 3, params)
    assert a == b and len(a[0][0]) == 12
    assert np.allclose(np.concatenate([np.ravel(x) for g in lpa for x in g]),
                       np.concatenate([np.ravel(x) for g in lpb for x in g]), atol=1e-5)
