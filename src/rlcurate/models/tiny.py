"""The tiny model of the book's CPU world (chapter 4): a Qwen2-architecture causal LM of about one
million parameters and a character-level tokenizer that loads through the same Hugging Face code
path as a real Qwen checkpoint.

Why the tokenizer is a byte-level BPE with no merges: in transformers 5.x, ``AutoTokenizer`` builds a
``Qwen2Tokenizer`` for every ``model_type="qwen2"`` checkpoint and rebuilds its pipeline from the
vocabulary and the merges (NFC, the Qwen split regex, ByteLevel), dropping any custom pre-tokenizer.
A tokenizer that *is* a ``Qwen2Tokenizer`` whose vocabulary holds single characters and whose merge
list is empty survives that rebuild unchanged: every character is one token, before and after a
save/load round trip.
"""

from __future__ import annotations

import contextlib
import json
import string
from pathlib import Path
from typing import Any, Mapping

import torch

from rlcurate.provenance import package_versions, provenance

PAD, EOS, USER, ASSISTANT = "<|pad|>", "<|endoftext|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, EOS, USER, ASSISTANT)
# Byte-level images of the characters the arithmetic formats use: "Ġ" is the space, "Ċ" the newline.
CHARACTERS = tuple("0123456789") + tuple("+-*/=()#:.,;?!") + ("Ġ", "Ċ") + tuple(string.ascii_lowercase)
VOCAB_SIZE = 64  # the embedding size: len(SPECIAL_TOKENS + CHARACTERS) = 56, rounded up

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + EOS +
    "{% else %}{{ raise_exception('the tiny chat template knows the roles user and assistant, got ' + m['role']) }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)

TINY_CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    # RoPE has no position parameters, so a generous limit costs nothing; prompt plus completion of
    # the tiny arithmetic levels stays under 60 tokens (about 100 with user-turn hints).
    max_position_embeddings=256,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)


def build_tiny_tokenizer():
    """The tiny model's tokenizer (chapter 4): a ``Qwen2Tokenizer`` with one token per character
    (digits, ``+-*/=()#:.,;?!``, space, newline, a-z), special tokens ``<|pad|>``, ``<|endoftext|>``
    (eos), ``<|user|>``, ``<|assistant|>``, and the chat template
    ``<|user|>{question}<|assistant|>{answer}<|endoftext|>``. Characters outside the vocabulary are
    dropped when encoding."""
    from transformers import Qwen2Tokenizer

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        pad_token=PAD,
        eos_token=EOS,
        unk_token=None,
        extra_special_tokens=[USER, ASSISTANT],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # generation pads on the left
    return tokenizer


def tiny_config(**overrides):
    """The ``Qwen2Config`` of the tiny model (chapter 4): :data:`TINY_CONFIG` with ``overrides``
    (for example ``hidden_size=256, intermediate_size=1024``)."""
    from transformers import Qwen2Config

    unknown = set(overrides) - set(Qwen2Config().to_dict()) - set(TINY_CONFIG)
    if unknown:
        raise ValueError(f"config has unknown Qwen2Config fields: {sorted(unknown)}")
    fields = {**TINY_CONFIG, **overrides}
    ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    if fields["vocab_size"] < len(SPECIAL_TOKENS) + len(CHARACTERS):
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + len(CHARACTERS)}, got {fields['vocab_size']}")
    return Qwen2Config(pad_token_id=ids[PAD], eos_token_id=ids[EOS], bos_token_id=None, **fields)


def build_tiny_model(config=None, seed: int = 0):
    """A freshly initialised tiny ``Qwen2ForCausalLM`` (chapter 4): hidden size 128, 4 layers, 4
    attention heads with 2 key-value heads, tied embeddings, 993,408 parameters by default.

    ``config`` is None (the default), a dict of overrides of :data:`TINY_CONFIG`, or a
    ``Qwen2Config``. The initial weights depend only on ``seed``; the global torch RNG is untouched.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if config is None:
        config = tiny_config()
    elif isinstance(config, Mapping):
        config = tiny_config(**config)
    elif not isinstance(config, Qwen2Config):
        raise ValueError(f"config must be None, a dict or a Qwen2Config, got {type(config).__name__}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = config.pad_token_id, config.eos_token_id, None
    return model


def count_params(model) -> int:
    """Number of distinct parameters of ``model``, tied embeddings counted once (chapter 4)."""
    return sum(p.numel() for p in model.parameters())


def save_tiny(model, tokenizer, path, **info) -> Path:
    """Save ``model`` and ``tokenizer`` as a Hugging Face checkpoint in ``path`` (safetensors,
    config, tokenizer, chat template) plus ``rlcurate.json`` holding ``info``, the parameter count,
    package versions and the :func:`~rlcurate.provenance.provenance` record ``environment`` (chapter 4).
    Returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with _quiet_hf_progress():
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    device = next(model.parameters()).device
    record = {"n_params": count_params(model), "versions": package_versions(),
              "environment": provenance(device=device), **info}
    (path / "rlcurate.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def load_tiny(path):
    """``(model, tokenizer)`` of a tiny checkpoint, loaded through ``AutoModelForCausalLM`` and
    ``AutoTokenizer`` exactly as a Hub checkpoint would be; the model is in eval mode and the
    tokenizer pads on the left (chapter 4)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"path must be a checkpoint directory with a config.json, got {str(path)!r}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    with _quiet_hf_progress():
        model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tokenizer


@contextlib.contextmanager
def _quiet_hf_progress():
    """Hide transformers' per-file progress bars (one 1 MB shard is not worth a bar)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
