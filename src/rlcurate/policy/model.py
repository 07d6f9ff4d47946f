"""A causal language model as a :class:`~rlcurate.policy.base.Policy` that samples and scores
(chapters 3, 5, 8); :class:`rlcurate.train.policy.LMPolicy` adds the update."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import numpy as np

from rlcurate.policy import scoring

__all__ = ["ModelPolicy"]


class ModelPolicy:
    """``model`` and its ``tokenizer``; ``engine`` (a :class:`~rlcurate.rollout.RolloutEngine` on the
    same model, optional) samples. Scores are computed in micro-batches of ``token_budget`` tokens,
    under ``autocast`` (bf16 on a GPU)."""

    def __init__(self, model, tokenizer, engine=None, *, token_budget: int = 16384,
                 autocast: Callable = nullcontext):
        self.model = model
        self.tokenizer = tokenizer
        self.engine = engine
        self.token_budget = int(token_budget)
        self.autocast = autocast
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)

    def generate(self, prompts, n, params, seed):
        if self.engine is None:
            raise RuntimeError("this policy has no rollout engine to sample with")
        with self.autocast():
            return self.engine.generate(prompts, n, params, seed=seed)

    def sequence_logprobs(self, contexts, continuations, token_budget: int | None = None) -> list[np.ndarray]:
        return scoring.sequence_logprobs(self.model, contexts, continuations, self.pad_id,
                                         token_budget or self.token_budget)

    def sequence_logprobs_and_ranks(self, contexts, continuations,
                                    token_budget: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        return scoring.sequence_logprobs_and_ranks(self.model, contexts, continuations, self.pad_id,
                                                   token_budget or self.token_budget)

    def grad_norms(self, group) -> np.ndarray:
        prompt_ids = list(self.tokenizer.encode(group.prompt, add_special_tokens=False))
        return scoring.grad_norms(self.model, prompt_ids, group.completions)
