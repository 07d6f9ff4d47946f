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

from .base import Completion, RolloutEngine, SamplingParams, prompt_seed
from .hf import TransformersEngine, plan_batches
from .openai_api import MalformedResponseError, OpenAIEngine, OpenAIServerError
from .vllm_engine import VLLMEngine

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
