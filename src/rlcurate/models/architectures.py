"""The architectures of the Hub checkpoints that the GPU configurations train (appendix A1).

Each entry holds the architecture fields of the checkpoint's published ``config.json``, enough to build
the same network with random weights (:func:`random_checkpoint`) without the Hub: the planner counts
its parameters and activations from it (:mod:`rlcurate.plan`), and the dry run trains it through the
GPU code path on any machine (:mod:`rlcurate.dryrun`). Throughput and memory do not depend on the
weights' values.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rlcurate.errors import UserError, write_failure

__all__ = ["ARCHITECTURES", "architecture", "hf_config", "model_parameters", "param_count", "random_checkpoint"]

_QWEN2_COMMON = dict(model_type="qwen2", vocab_size=151936, rms_norm_eps=1e-6, hidden_act="silu",
                     use_sliding_window=False, tie_word_embeddings=True, bos_token_id=151643)

ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-0.5B-Instruct, config.json
    "Qwen/Qwen2.5-0.5B-Instruct": dict(_QWEN2_COMMON, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                       max_position_embeddings=32768, rope_theta=1000000.0,
                                       eos_token_id=151645),
    # Qwen/Qwen2.5-Math-1.5B, config.json
    "Qwen/Qwen2.5-Math-1.5B": dict(_QWEN2_COMMON, hidden_size=1536, intermediate_size=8960,
                                   num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                   max_position_embeddings=4096, rope_theta=10000.0, eos_token_id=151643),
    # Qwen/Qwen3-0.6B, config.json
    "Qwen/Qwen3-0.6B": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                            num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                            max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                            hidden_act="silu", tie_word_embeddings=True, attention_bias=False,
                            use_sliding_window=False, bos_token_id=151643, eos_token_id=151645),
}
ARCHITECTURES["Qwen/Qwen2.5-0.5B"] = ARCHITECTURES["Qwen/Qwen2.5-0.5B-Instruct"]

SMOLLM2 = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)
"""The architecture of ``model: smollm2`` (SmolLM2-135M-Instruct, the fields of its exported config.json), so
that its size is known before its GGUF file is first read (:func:`model_parameters`)."""


def architecture(model_id: str) -> dict[str, Any]:
    """The architecture fields of ``model_id``; ``KeyError`` naming the known ids otherwise."""
    try:
        return dict(ARCHITECTURES[model_id])
    except KeyError:
        raise KeyError(f"no architecture recorded for {model_id!r}; known: {', '.join(sorted(ARCHITECTURES))}") from None


def hf_config(model_id: str, **changes):
    """The transformers config of ``model_id``'s architecture, with ``changes`` (for example fewer
    layers for a CPU dry run)."""
    from transformers import AutoConfig

    fields = {**architecture(model_id), **changes}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def param_count(config) -> int:
    """Parameters of the model of the transformers ``config`` (tied embeddings counted once), counted on the
    meta device: no memory, no weights."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def model_parameters(name_or_path) -> int | None:
    """Parameters of the model a run config names, from its architecture alone: ``smollm2``, a checkpoint
    directory (its ``config.json``) or a Hub id recorded in :data:`ARCHITECTURES`; ``None`` for another Hub id
    (only loading it would tell) or a ``config.json`` transformers cannot build a model from."""
    from transformers import AutoConfig

    name = str(name_or_path)
    if name == "smollm2":
        fields = dict(SMOLLM2)
        return param_count(AutoConfig.for_model(fields.pop("model_type"), **fields))
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        try:
            return param_count(AutoConfig.from_pretrained(path))
        except (OSError, ValueError, KeyError):
            return None
    if name in ARCHITECTURES:
        return param_count(hf_config(name))
    return None


def random_checkpoint(model_id: str, folder, tokenizer_dir, seed: int = 0, **changes) -> Path:
    """Write a checkpoint of ``model_id``'s architecture with random weights (bf16 on disk, as the Hub's)
    and the tokenizer files of ``tokenizer_dir`` to ``folder``; return ``folder``. Loading it with
    ``from_pretrained`` is the code path of a Hub checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(model_id, **changes), dtype=torch.bfloat16)
    try:
        model.save_pretrained(folder)
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
                shutil.copy(f, folder / f.name)
    except Exception as exc:
        if (reason := write_failure(exc)) is None:
            raise
        size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
        free = shutil.disk_usage(folder).free / 2**30
        raise UserError(f"{folder}: could not write the random checkpoint of {model_id} ({reason}): it takes "
                        f"{size:.2f} GiB and {free:.2f} GiB are free there; free some space or set TMPDIR to a "
                        f"larger disk") from None
    return folder
