"""Rollout engines (chapter 4, *The variance audit*): prompts in, sampled completions with token
log-probabilities out.

One interface, :class:`RolloutEngine`, with ``generate(prompts, n, params, seed)`` returning
``result[i][j]``, sample ``j`` of prompt ``i``, as a :class:`Completion`. Backends:

=========================  ==========================================================================
:class:`TransformersEngine`  the default: a KV-cached decode loop over a Hugging Face causal LM (CPU/GPU)
:class:`VLLMEngine`          offline vLLM on a CUDA GPU (optional extra; untested here)
:class:`OpenAIEngine`        any OpenAI-compatible server (``vllm serve``, :mod:`rlcurate.rollout.server`)
=========================  ==========================================================================

What ``Completion.logprobs`` mean, how stop strings and EOS end a completion, and how prompts are
encoded is written once, in :mod:`rlcurate.rollout.base`.
"""

import importlib

from .base import Completion, RolloutEngine, SamplingParams, prompt_seed

# The backends load on first use: importing rlcurate.rollout.base (the sampling contract, DECODE_MODES, which
# the training config checks before torch is imported) must not pull in torch and transformers.
_BACKENDS = {"TransformersEngine": ".hf", "plan_batches": ".hf", "MalformedResponseError": ".openai_api",
             "OpenAIEngine": ".openai_api", "OpenAIServerError": ".openai_api", "VLLMEngine": ".vllm_engine"}


def __getattr__(name: str):
    if name in _BACKENDS:
        return getattr(importlib.import_module(_BACKENDS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Completion",
    "MalformedResponseError",
    "OpenAIEngine",
    "OpenAIServerError",
    "RolloutEngine",
    "SamplingParams",
    "TransformersEngine",
    "VLLMEngine",
    "plan_batches",
    "prompt_seed",
]
