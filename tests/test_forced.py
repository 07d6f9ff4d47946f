"""The forced engine's two layouts of a prompt's completions (rlcurate.rollout.forced, issues #14 and #26): over
the prompt's cached keys and values, or each completion after its own copy of the prompt in one pass. Both must
give every stored token's logits; the replays (tests/test_replay.py) then compare the metrics they lead to."""

from __future__ import annotations

import pytest
import torch

from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.rollout import TransformersEngine
from rlcurate.rollout.forced import ForcedEngine

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def engine():
    tok = build_tiny_tokenizer()
    inner = TransformersEngine(build_tiny_model(dict(initializer_range=0.1), seed=0).eval(), tok)
    return ForcedEngine(inner, calls=[])


def test_a_long_prompts_cached_keys_give_the_logits_of_one_pass(engine):
    tok = engine.inner.tokenizer
    prompt = tok("<|user|>123+456+789=<|assistant|>")["input_ids"]
    completions = [tok(text)["input_ids"] for text in ("1368", "13", "1", "99+1=100")]
    assert len(prompt) > max(map(len, completions))
    with torch.inference_mode():
        cached = engine._logits_over_prompt(prompt, completions)
        one_pass = engine._logits_of_rows(prompt, completions)
    vocab = engine.inner.model.get_output_embeddings().weight.shape[0]
    for toks, a, b in zip(completions, cached, one_pass):
        assert a.shape == b.shape == (len(toks), vocab)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # a shifted position or a completion's token missing from the cache would move them far apart
    assert not torch.allclose(cached[3][1:], one_pass[3][:-1], rtol=1e-3, atol=1e-3)


def test_each_prompt_takes_the_layout_that_pays(engine, monkeypatch):
    """The cached layout for a prompt longer than its completions, one pass for the others, nothing for a
    prompt without completions."""
    taken = []
    for name in ("_logits_over_prompt", "_logits_of_rows"):
        real = getattr(engine, name)
        monkeypatch.setattr(engine, name, lambda p, t, real=real, name=name: taken.append(name) or real(p, t))
    tok = engine.inner.tokenizer
    long_prompt, short_prompt = tok("<|user|>12+34=<|assistant|>")["input_ids"], tok("1+1=")["input_ids"]
    with torch.inference_mode():
        out = engine._logits([long_prompt, short_prompt, short_prompt],
                             [[tok("46")["input_ids"]] * 2, [tok("2 is the sum<|endoftext|>")["input_ids"]], []])
    assert taken == ["_logits_over_prompt", "_logits_of_rows"]
    assert [len(rows) for rows in out] == [2, 1, 0]
