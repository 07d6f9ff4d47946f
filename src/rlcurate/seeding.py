"""Named random streams (chapters 5-10).

Every random choice of a run draws from a stream named by what it is for, so that two uses never
share random numbers and a resumed run reproduces every choice. A stream is a numpy generator on the
entropy ``[seed, *keys, tag]``:

======================  ======================  ==============================================
stream                  keys                    what draws from it
======================  ======================  ==============================================
``epoch_order``         epoch                   the order of a pass over the training pool
``curator``             step                    a strategy's own choices in a step (``ctx.rng``)
``minibatch``           step                    the minibatch split of a step's samples
``prefilter_pick``      (none)                  the prompts a live prefilter audits
``prefilter_step``      step                    the prefilter's re-audit draws
``prefilter_epoch``     epoch                   the order of a pass over the prefiltered pool
======================  ======================  ==============================================

The tags of these streams (3, 17, 29, 7, 11, 5) are the numbers the committed reference runs were
made with, kept so that those runs replay exactly. Generation calls of a step use
:func:`generation_seed`, whose entropy ``[seed, step, k]`` skips the per-step tags 11, 17 and 29, so a
step's k-th generation can never rebuild a stream above (the runs never made more than ten calls in a
step, so skipping changes none of them). One coincidence of shape is left from those runs: epoch e's
``epoch_order`` and generation call 3 of step e share the entropy ``[seed, e, 3]``; they feed a
permutation and an integer seed, not one another. A stream added now gets :func:`named_stream`, in a
namespace of its own that no entropy above can reach.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["TAGS", "stream", "named_stream", "generation_seed", "EVAL_SEED_OFFSET"]

TAGS = {"epoch_order": 3, "prefilter_epoch": 5, "prefilter_pick": 7, "prefilter_step": 11, "curator": 17,
        "minibatch": 29}
_PER_STEP_TAGS = frozenset({TAGS["prefilter_step"], TAGS["curator"], TAGS["minibatch"]})
_NAMESPACE = 0x5EED5
EVAL_SEED_OFFSET = 1_000_003
"""Held-out evaluation samples with the engine seed ``seed + EVAL_SEED_OFFSET`` at every evaluation
(common random numbers: evaluations of one run differ only by the policy)."""


def stream(name: str, seed: int, *keys: int) -> np.random.Generator:
    """The generator of the stream ``name`` (one of :data:`TAGS`) for ``seed`` and ``keys``."""
    if name not in TAGS:
        raise ValueError(f"unknown stream {name!r}; streams: {', '.join(TAGS)} (new ones: named_stream)")
    return np.random.default_rng([int(seed), *(int(k) for k in keys), TAGS[name]])


def named_stream(name: str, seed: int, *keys: int) -> np.random.Generator:
    """A stream for a new use: entropy ``[seed, namespace, crc32(name), *keys]``, disjoint from every
    tagged stream and from the generation seeds."""
    return np.random.default_rng([int(seed), _NAMESPACE, zlib.crc32(name.encode()), *(int(k) for k in keys)])


def generation_seed(seed: int, step: int, call: int) -> int:
    """The engine seed of the ``call``-th generation (1, 2, ...) of ``step``: the first integer of the
    generator on ``[seed, step, k]``, k the call-th positive integer that is not a per-step tag."""
    if call < 1:
        raise ValueError(f"call counts from 1, got {call}")
    k = 0
    while call:
        k += 1
        call -= k not in _PER_STEP_TAGS
    return int(np.random.default_rng([int(seed), int(step), k]).integers(0, 2**62))
