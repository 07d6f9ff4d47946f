"""Group-relative advantages (chapters 1-3; used by the simulated world and the GRPO trainer).

For one prompt's group of rewards r_1..r_n:

- ``standardised`` (GRPO): A_i = (r_i - mean r) / (std r + eps); verl and TRL use the Bessel std
  (ddof = 1) and eps = 1e-6 / 1e-4. A group of one reward gets A = 0.
- ``centred`` (Dr. GRPO; Reinforce-Ada's r - p_hat): A_i = r_i - b, with b the group mean or a
  baseline estimated from a larger pool.
- ``rloo``: A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean r).
- ``raft``: A_i = r_i (rejection sampling: train only on accepted samples).

Every one is zero on a group whose rewards are all equal except ``raft`` on an all-correct group,
which is the point of chapter 1.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from rlcurate._validate import as_finite

__all__ = ["standardised", "centred", "rloo", "raft", "ADVANTAGES", "group_advantages"]


def _rewards(r) -> np.ndarray:
    arr = as_finite(r, "rewards")
    if arr.ndim < 1:
        raise ValueError(f"rewards must be a group (1-D) or a batch of equal groups (2-D), got a scalar {r!r}")
    return arr


# Each rule acts on the last axis: a 1-D array is one group, a 2-D array a batch of equal-size groups.


def standardised(r, eps: float = 1e-6, ddof: int = 1) -> np.ndarray:
    """GRPO: (r - mean) / (std + eps), std with ``ddof`` (1 as verl/TRL); zeros for a group of one."""
    r = _rewards(r)
    if r.shape[-1] <= ddof:
        return np.zeros_like(r)
    mean = r.mean(axis=-1, keepdims=True)
    return (r - mean) / (r.std(axis=-1, ddof=ddof, keepdims=True) + eps)


def centred(r, baseline=None) -> np.ndarray:
    """Dr. GRPO / Reinforce-Ada: r - b with b the group mean, or a given ``baseline`` (e.g. p_hat
    from the whole oversampled pool; one per group for a 2-D batch)."""
    r = _rewards(r)
    if baseline is None:
        b = r.mean(axis=-1, keepdims=True)
    else:
        b = np.asarray(baseline, dtype=float)
        b = b[..., None] if b.ndim and r.ndim > 1 else b
    return r - b


def rloo(r) -> np.ndarray:
    """RLOO: r_i minus the mean of the other rewards of the group; zeros for a group of one."""
    r = _rewards(r)
    n = r.shape[-1]
    if n < 2:
        return np.zeros_like(r)
    return (r - r.mean(axis=-1, keepdims=True)) * n / (n - 1)


def raft(r) -> np.ndarray:
    """RAFT: the reward itself (binary rewards keep the accepted samples only)."""
    return _rewards(r).copy()


ADVANTAGES = {"standardised": standardised, "grpo": standardised, "centred": centred,
              "drgrpo": centred, "rloo": rloo, "raft": raft}


def group_advantages(groups: Iterable[Sequence[float]], kind: str = "grpo", **kwargs) -> list[np.ndarray]:
    """Apply one advantage rule to each group of a (possibly ragged) batch."""
    if kind not in ADVANTAGES:
        raise ValueError(f"kind must be one of {sorted(ADVANTAGES)}, got {kind!r}")
    fn = ADVANTAGES[kind]
    return [fn(g, **kwargs) for g in groups]
