"""Which samples an audit reads, in which order, with which random streams and in which batches
(chapter 4, *The variance audit*).

Chunk ``c`` of an audit holds the samples at audit positions ``c * chunk_size`` up to
``(c + 1) * chunk_size - 1`` (:func:`audit_order`); it is generated with the seed
:func:`chunk_seed` ``(seed, c)`` in batches of whole samples (:func:`sub_batches`). All three depend
only on the audit's configuration and the prompts, never on what was done before, which is what makes
a resumed audit write the lines an uninterrupted one writes (:mod:`rlcurate.audit.runner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from rlcurate.audit.config import AuditConfig

__all__ = ["audit_order", "chunk_seed", "sub_batches"]


def audit_order(n_problems: int, config: AuditConfig) -> np.ndarray:
    """Positions of the task's problems in audit order (chapter 4): a permutation drawn with
    ``subset_seed`` (or the identity without shuffling), cut to ``limit``. The order of the first
    ``k`` samples does not depend on ``limit``, so a larger limit extends an audit."""
    if config.shuffle:
        order = np.random.default_rng([int(config.subset_seed), 0xA0D1]).permutation(n_problems)
    else:
        order = np.arange(n_problems)
    if config.limit is not None:
        order = order[: config.limit]
    return order


_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def chunk_seed(seed: int, chunk: int) -> int:
    """The generation seed of chunk ``chunk`` (chapter 4): ``H(H(H(seed) xor chunk) xor D) >> 1`` with
    ``H`` the SplitMix64 mixer and ``D`` a constant of the audit, a 63-bit number. The seed is hashed
    before the chunk is mixed in, so no two (seed, chunk) pairs of practical size share a stream."""
    x = _splitmix64(int(seed) & _M64)
    x = _splitmix64(x ^ (int(chunk) & _M64))
    x = _splitmix64(x ^ 0xA0D17)
    return x >> 1


def sub_batches(prompt_lengths: Sequence[int], runs: int, max_new_tokens: int, token_budget: int) -> list[list[int]]:
    """Split a chunk into batches of consecutive samples, each generated and written by itself
    (chapter 4). A batch of ``b`` samples whose longest prompt has ``L`` tokens holds ``b * runs``
    rows and is charged ``b * runs * (L + max_new_tokens)`` tokens, the cost model of the local
    engine's batches (:func:`rlcurate.rollout.hf.plan_batches`); samples are added while the charge
    stays within ``token_budget``, and a sample that alone exceeds it gets a batch of its own.
    Returns lists of positions in the chunk. The split depends only on the prompts and the audit's
    settings, so a resumed audit redoes a batch with the same shapes."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for k, length in enumerate(prompt_lengths):
        top = max(longest, int(length))
        if cur and (len(cur) + 1) * runs * (top + max_new_tokens) > token_budget:
            out.append(cur)
            cur, top = [], int(length)
        cur.append(k)
        longest = top
    if cur:
        out.append(cur)
    return out
