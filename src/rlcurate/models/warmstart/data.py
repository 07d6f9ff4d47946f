"""The supervised examples of the warm-start (chapter 4): prompt, reference completion and eos, the
loss on the completion only, in length-bucketed batches.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rlcurate.tasks.arithmetic import HINT_LEVELS, ArithmeticTask
from rlcurate.tasks.base import Problem

__all__ = ["BUCKETS", "encode_example", "make_batches"]

BUCKETS = 8  # batches drawn at once and bucketed by length


def encode_example(tokenizer, task: ArithmeticTask, problem: Problem, hint_level: int = 0) -> tuple[list[int], int]:
    """Token ids of prompt + reference completion + eos, and the prompt length: the supervised
    example of the warm-start (chapter 4). The prompt carries the hint of ``hint_level`` (chapter 7);
    with an assistant-side hint the completion is the rest of the reference after the revealed steps."""
    prompt = task.render(problem, tokenizer, hint=task.placed_hint(problem, hint_level) or None)
    full = task.render(problem, tokenizer) + task.target(problem)
    # an assistant-side hint is the start of the reference: the model is trained on the rest
    completion = full[len(prompt):] if full.startswith(prompt) else task.target(problem)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return prompt_ids + completion_ids + [tokenizer.eos_token_id], len(prompt_ids)


def _pad_batch(rows: list[list[int]], starts: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (ids, s) in enumerate(zip(rows, starts)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        labels[i, s : len(ids)] = torch.tensor(ids[s:])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def make_batches(tokenizer, task: ArithmeticTask, rng: np.random.Generator, batch_size: int, n_batches: int = 1,
                 hint_share: float = 0.0, level_weights: Sequence[float] | None = None) -> list[dict[str, torch.Tensor]]:
    """``n_batches`` right-padded training batches of fresh train-split problems (chapter 4):
    ``input_ids``, ``attention_mask`` and ``labels`` (-100 on the prompt and the padding, so the loss
    covers the completion and eos). A share ``hint_share`` of the prompts carries a hint of level 1-3.

    The ``n_batches * batch_size`` examples are sorted by length before they are cut into batches
    (length bucketing: less padding, the same data), and the batches come in random order.
    """
    p = None
    if level_weights is not None and len(set(level_weights)) > 1:  # equal weights: uniform, as None
        p = np.asarray(level_weights, dtype=float)
        p = p / p.sum()
    examples = []
    for _ in range(batch_size * n_batches):
        level = task.levels[int(rng.choice(len(task.levels), p=p))]
        problem = task.sample(rng, "train", level)
        hint_level = int(rng.choice(HINT_LEVELS)) if rng.random() < hint_share else 0
        examples.append(encode_example(tokenizer, task, problem, hint_level))
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), i))
    batches = []
    for b in rng.permutation(n_batches):
        chunk = [examples[i] for i in order[b * batch_size : (b + 1) * batch_size]]
        batches.append(_pad_batch([e[0] for e in chunk], [e[1] for e in chunk], tokenizer.pad_token_id))
    return batches
