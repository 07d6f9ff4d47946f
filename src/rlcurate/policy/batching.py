"""What a language-model step trains on, and how it is cut into micro-batches (chapter 5).

:class:`TrainSample` is one completion with its advantage; :func:`plan_micro_batches` packs samples
under a token budget, keeping the samples of one prompt together so that
:func:`rlcurate.policy.scoring.forward_logprobs` encodes their prompt once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["TrainSample", "plan_micro_batches"]


@dataclass
class TrainSample:
    """One completion to train on."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    token_weights: np.ndarray | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    coef: torch.Tensor | None = None  # kappa_t per token, set by aggregation_coefficients

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def plan_micro_batches(samples: Sequence[TrainSample], token_budget: int) -> list[list[int]]:
    """Group sample indices so that (rows x longest row) <= ``token_budget`` per micro-batch; samples
    are taken longest first so that padding stays small, and the samples of one prompt (a GRPO group)
    stay next to each other so that :func:`forward_logprobs` can encode their prompt once. A sample
    longer than the budget gets its own micro-batch. With distinct prompts the order is simply longest
    first, ties by index."""
    group_len: dict[tuple, int] = {}
    group_first: dict[tuple, int] = {}
    for i, s in enumerate(samples):
        key = tuple(s.prompt_ids)
        group_len[key] = max(group_len.get(key, 0), s.length)
        group_first.setdefault(key, i)

    def order_key(i):
        key = tuple(samples[i].prompt_ids)
        return (-group_len[key], group_first[key], -samples[i].length, i)

    order = sorted(range(len(samples)), key=order_key)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        L = samples[i].length
        if current and max(longest, L) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, L)
    if current:
        batches.append(current)
    return batches
