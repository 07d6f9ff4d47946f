"""Encoding a batch's distinct prompts, with the beginning they all share encoded once (chapters 4, 5;
used by the rollout engine and by the trainer's scoring, so it sits below both).

A batch's prompts usually begin alike: the chat template's system turn, few-shot examples, an
instruction. SmolLM2's chat arithmetic prompt (appendix A3) is 129 tokens, of which the first 120 are
the same for every question. :func:`prefill_prompts` runs that common prefix through the model once,
indexes its key-value cache out to one row per prompt, and runs only each prompt's remainder on top
of it (left-padded after the prefix, that padding masked out, positions continuing from the prefix).
The numbers are those of encoding every prompt whole, up to float rounding between batch shapes, and
with gradients on they flow back through the shared prefix into the weights exactly as they would
through each copy. Used by the rollout engine's prefill (:class:`rlcurate.rollout.TransformersEngine`)
and by the trainer's scoring (:func:`rlcurate.policy.scoring.forward_logprobs`).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["MIN_SHARED_PREFIX", "common_prefix_length", "shared_prefix_length", "plain_cache", "prefill_prompts"]

# a common prefix shorter than this is encoded with each prompt: the extra forward call would cost
# more than the few tokens it saves
MIN_SHARED_PREFIX = 16


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """The number of leading tokens every prompt shares, at most the shortest prompt's length minus one
    (each prompt keeps at least one token of its own, whose output predicts its continuation)."""
    if not prompts:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def shared_prefix_length(prompts: Sequence[Sequence[int]], min_shared: int | None = None) -> int:
    """The number C of leading tokens :func:`prefill_prompts` encodes once for ``prompts``: their
    :func:`common_prefix_length` when two or more prompts share at least ``min_shared`` tokens (default
    :data:`MIN_SHARED_PREFIX`, read at call time), else 0."""
    if len(prompts) < 2:
        return 0
    C = common_prefix_length(prompts)
    return C if C >= (MIN_SHARED_PREFIX if min_shared is None else min_shared) else 0


def plain_cache(cache) -> bool:
    """Whether ``cache`` is a plain growing key-value cache (every layer a ``DynamicLayer``), whose rows
    can be indexed and extended; models with their own cache types, and gradient checkpointing (which
    turns the cache off in training), give something else."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def prefill_prompts(module, prompts: Sequence[Sequence[int]], pad_id: int, device, min_shared: int | None = None,
                    **kwargs):
    """Run ``module`` (a decoder or a causal LM) over the distinct ``prompts``, with a key-value cache.

    With a common prefix of C >= ``min_shared`` tokens (default :data:`MIN_SHARED_PREFIX`) among two or
    more prompts, the prefix is encoded once (one row) and its cache indexed out to every prompt; the
    remainders, left-padded to S tokens, follow. Otherwise the prompts are left-padded whole (C = 0).
    ``kwargs`` go to every call (``logits_to_keep=1`` for a causal LM's prefill). When the prefix's cache is
    not a :func:`plain_cache` (its rows cannot be indexed out), the prompts are encoded whole instead.

    Returns ``(out, attn, pos)``: the module's output for the remainders (its last position is each
    prompt's last token; ``out.past_key_values`` holds all C + S columns), the attention mask [U, C + S]
    of those columns (ones over the prefix and each prompt's own tokens, zeros over padding) and their
    position ids [U, C + S] (0 .. len - 1 over each prompt's tokens).
    """
    U = len(prompts)
    C = shared_prefix_length(prompts, min_shared)
    past = None
    if C:
        prefix = torch.tensor(prompts[0][:C], dtype=torch.long, device=device)[None]
        ones = torch.ones_like(prefix)
        pre = module(input_ids=prefix, attention_mask=ones, position_ids=ones.cumsum(-1) - 1, use_cache=True,
                     **kwargs)
        past = pre.past_key_values
        if plain_cache(past):
            past.batch_select_indices(torch.zeros(U, dtype=torch.long, device=device))  # differentiable
        else:
            C, past = 0, None
    rest = [p[C:] for p in prompts]
    S = max(len(r) for r in rest)
    ids = torch.full((U, S), pad_id, dtype=torch.long)
    attn = torch.zeros((U, C + S), dtype=torch.long)
    attn[:, :C] = 1
    for u, r in enumerate(rest):
        ids[u, S - len(r):] = torch.tensor(r)
        attn[u, C + S - len(r):] = 1
    ids, attn = ids.to(device), attn.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = module(input_ids=ids, attention_mask=attn, position_ids=pos[:, C:], past_key_values=past, use_cache=True,
                 **kwargs)
    return out, attn, pos
