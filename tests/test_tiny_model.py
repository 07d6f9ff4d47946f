"""The tiny Qwen2 model and its tokenizer (chapter 4): save/load through the Auto classes, and the
committed ``data/tiny`` checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcurate.models.tiny import (
    CHARACTERS,
    build_tiny_model,
    build_tiny_tokenizer,
    count_params,
    load_tiny,
    save_tiny,
    tiny_config,
)
from rlcurate.tasks.arithmetic import TINY_LEVELS, ArithmeticTask

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "data" / "tiny"


def _format_strings() -> list[str]:
    """Every tiny format: prompts at hint levels 0-3, full training sequences, both completion styles."""
    tok = build_tiny_tokenizer()
    out = []
    for scratchpad in (True, False):
        task = ArithmeticTask(scratchpad=scratchpad, n_train=4, n_test=4, seed=1)
        for p in task.problems("train") + task.problems("test"):
            for k in range(4):
                prompt = task.render(p, tok, hint=task.hint(p, k) or None)
                out += [prompt, prompt + task.target(p) + tok.eos_token, task.target(p)]
    return out + ["hello world", "a  b\n\n c", " 12 + 34 = 46", "(1+2)*3/4=.75;!?", "<|pad|><|pad|>7"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(seed=0)
    path = save_tiny(model, tok, tmp_path_factory.mktemp("tiny"), note="round trip")
    return model, tok, path


def test_architecture_and_size():
    model = build_tiny_model()
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers) == ("qwen2", 128, 4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (4, 2, True)
    assert 0.9e6 < count_params(model) < 1.1e6
    assert len(build_tiny_tokenizer()) <= cfg.vocab_size
    wide = build_tiny_model({"hidden_size": 256, "intermediate_size": 1024})
    assert 3.5e6 < count_params(wide) < 4.5e6
    with pytest.raises(ValueError, match="seed"):
        build_tiny_model(seed=-1)
    with pytest.raises(ValueError, match="config"):
        build_tiny_model(config="big")
    with pytest.raises(ValueError, match="unknown"):
        tiny_config(hiden_size=3)


def test_initialisation_depends_only_on_seed():
    torch.manual_seed(123)
    before = torch.rand(1)
    a, b, c = build_tiny_model(seed=7), build_tiny_model(seed=7), build_tiny_model(seed=8)
    torch.manual_seed(123)
    assert torch.equal(before, torch.rand(1))  # the global RNG is untouched
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_every_format_character_is_one_token():
    tok = build_tiny_tokenizer()
    for s in _format_strings():
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == s
    assert len(tok("47+85=", add_special_tokens=False)["input_ids"]) == 6
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    assert len(set(CHARACTERS)) == len(CHARACTERS)


def test_tokenizer_round_trip_through_auto_classes(saved):
    from transformers import AutoTokenizer

    _, tok, path = saved
    loaded = AutoTokenizer.from_pretrained(path)
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    for s in _format_strings():
        assert loaded(s)["input_ids"] == tok(s)["input_ids"], s
        assert loaded.decode(loaded(s)["input_ids"]) == s
    msgs = [{"role": "user", "content": "12+34="}]
    assert loaded.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == "<|user|>12+34=<|assistant|>"
    assert (loaded.eos_token, loaded.pad_token) == (tok.eos_token, tok.pad_token)
    info = json.loads((path / "rlcurate.json").read_text())
    assert info["note"] == "round trip" and info["n_params"] == count_params(saved[0])


def test_model_round_trip_gives_identical_logits(saved):
    from transformers import AutoModelForCausalLM

    model, tok, path = saved
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    model.eval()
    texts = _format_strings()[:64:7]
    with torch.no_grad():
        for s in texts:
            x = torch.tensor([tok(s)["input_ids"]])
            assert torch.equal(model(x).logits, loaded(x).logits)
    assert loaded.generation_config.eos_token_id == tok.eos_token_id
    assert loaded.generation_config.pad_token_id == tok.pad_token_id


def test_chat_template_rejects_unknown_roles():
    tok = build_tiny_tokenizer()
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match=r"^the tiny chat template knows the roles user and assistant, got system$"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_load_tiny_rejects_a_non_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="path"):
        load_tiny(tmp_path)


def _generate_pass_counts(model, tok, task, problems, hint_level=0, n=8, seed=0) -> np.ndarray:
    """Correct samples out of ``n`` per problem with plain ``model.generate`` (pure sampling at T=1);
    prompts of equal token length share a batch, so no padding is needed."""
    prompts = [task.render(p, tok, hint=task.hint(p, hint_level) or None) for p in problems]
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(prompts):
        by_len.setdefault(len(tok(s)["input_ids"]), []).append(i)
    counts = np.zeros(len(problems), dtype=int)
    torch.manual_seed(seed)
    with torch.no_grad():
        for length, idx in sorted(by_len.items()):
            x = torch.tensor([tok(prompts[i])["input_ids"] for i in idx]).repeat_interleave(n, dim=0)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=task.max_completion_chars() + 4)
            texts = tok.batch_decode(out[:, length:], skip_special_tokens=True)
            for j, i in enumerate(idx):
                counts[i] = sum(task.reward(problems[i], t).value for t in texts[j * n : (j + 1) * n])
    return counts


@pytest.fixture(scope="module")
def spread():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = TINY / "spread"
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"the committed checkpoint {path} is missing")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path), path


@pytest.mark.slow
def test_committed_spread_checkpoint_has_mixed_pass_rates(spread):
    """The book's `spread` checkpoint, loaded by path through the Auto classes: at 8 samples per
    held-out prompt and temperature 1, at least 30% of the prompts are mixed (0 < k < 8)."""
    model, tok, path = spread
    config = json.loads((path / "train_config.json").read_text())
    assert tuple(config["levels"]) == TINY_LEVELS
    task = ArithmeticTask(config["levels"], n_test=12)
    counts = _generate_pass_counts(model, tok, task, task.problems("test"))
    mixed = float(((counts > 0) & (counts < 8)).mean())
    assert mixed >= 0.30, f"mixed share {mixed:.2f}, pass counts {np.bincount(counts, minlength=9)}"
    assert 0.1 < counts.mean() / 8 < 0.9


@pytest.mark.slow
def test_committed_spread_checkpoint_uses_hints(spread):
    """Chapter 7: revealing reference steps raises the pass rate of the hardest level (mul2)."""
    model, tok, _ = spread
    task = ArithmeticTask(["mul2"], n_test=12)
    problems = task.problems("test")
    rates = [_generate_pass_counts(model, tok, task, problems, hint_level=k, seed=1).mean() / 8 for k in (0, 3)]
    assert rates[1] > rates[0] + 0.3, rates


@pytest.mark.parametrize("stage", ["early", "spread", "saturated"])
def test_committed_checkpoints_are_complete(stage):
    path = TINY / stage
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "train_config.json", "train_log.jsonl", "README.md"):
        assert (path / name).is_file(), f"{path / name} is missing"
    assert (path / "model.safetensors").stat().st_size < 8_000_000
    log = [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in log) and any("eval" in r for r in log)
    assert "python -m rlcurate.models.warmstart" in (path / "README.md").read_text()
