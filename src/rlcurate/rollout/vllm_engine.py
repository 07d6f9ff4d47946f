"""A thin vLLM backend for GPU boxes (chapter 4, *The variance audit*).

vLLM is CUDA-only and pins its own torch and transformers, so it is an optional extra
(``pip install 'rlcurate[vllm]'``) and is imported only when :class:`VLLMEngine` is built.
"""

from __future__ import annotations

from .base import Completion, RolloutEngine, SamplingParams, prompt_seed


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "VLLMEngine needs vLLM, which is not installed. vLLM runs on CUDA GPUs only: "
            "pip install 'rlcurate[vllm]' (or pip install vllm) on a GPU machine. On CPU use "
            "TransformersEngine, or OpenAIEngine against a vLLM server running elsewhere."
        ) from exc
    return vllm


class VLLMEngine(RolloutEngine):
    """Generates with an offline ``vllm.LLM`` (chapter 4). **Untested in this project's CI**: vLLM
    cannot be installed on the CPU machines the project is tested on.

    Mapping of :class:`SamplingParams`: one ``vllm.SamplingParams`` per prompt with ``n = n_i``,
    ``seed = prompt_seed(seed, i)``, ``temperature``, ``top_p``, ``top_k`` (``-1`` for 0),
    ``max_tokens = max_new_tokens``, ``stop`` with ``include_stop_str_in_output=True`` (this package's
    convention), ``logprobs=1``, and neutral penalties, so that no checkpoint default leaks in.

    Log-probs: when ``model`` is a name or path the ``vllm.LLM`` is built with
    ``logprobs_mode="processed_logprobs"`` (log-probs after temperature and top-k/top-p), which equals
    this package's convention (``log softmax(logits / T)``, see :mod:`rlcurate.rollout.base`) when
    ``top_k=0`` and ``top_p=1``; vLLM's own default, ``raw_logprobs``, ignores the temperature. Text is
    detokenised by vLLM (special tokens skipped). Seeded outputs are reproducible on one GPU and vLLM
    version, not bit-identical to :class:`TransformersEngine`.

    Args:
        model: a model name or path (an ``LLM`` is built with ``llm_kwargs``) or a ready ``vllm.LLM``.
        llm_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``dtype``, ...).
    """

    def __init__(self, model, **llm_kwargs):
        self._vllm = _import_vllm()
        if isinstance(model, str):
            llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
            model = self._vllm.LLM(model=model, **llm_kwargs)
        self.llm = model

    def _sampling_params(self, params: SamplingParams, n: int, seed: int):
        return self._vllm.SamplingParams(
            n=n, seed=seed, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1, min_p=0.0, max_tokens=params.max_new_tokens,
            stop=list(params.stop), include_stop_str_in_output=True, logprobs=1,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
        )

    def _generate(self, prompts, counts, params, seed, progress):
        requests, sps, where = [], [], []
        for i, (p, c) in enumerate(zip(prompts, counts)):
            if c == 0:
                continue
            requests.append(p if isinstance(p, str) else {"prompt_token_ids": list(p)})
            sps.append(self._sampling_params(params, c, prompt_seed(seed, i)))
            where.append(i)
        results: list[list[Completion]] = [[] for _ in prompts]
        if not requests:
            return results
        for i, out in zip(where, self.llm.generate(requests, sps, use_tqdm=progress)):
            for j, o in enumerate(out.outputs):
                toks = list(o.token_ids)
                lps = [o.logprobs[t][tok].logprob for t, tok in enumerate(toks)] if o.logprobs else []
                results[i].append(Completion(
                    prompt_index=i, sample_index=j, prompt_token_ids=list(out.prompt_token_ids or []),
                    token_ids=toks, text=o.text, logprobs=lps,
                    finish_reason="stop" if o.finish_reason == "stop" else "length",
                ))
        return results
