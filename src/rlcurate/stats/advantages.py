"""Group-relative advantages (chapters 1-3; used by the simulated world and the GRPO trainer).

For one prompt's group of rewards r_1..r_n:

- ``standardised`` (GRPO): A_i = (r_i - mean r) / (std r + eps); verl and TRL use the Bessel std
  (ddof = 1) and eps = 1e-6 / 1e-4. A group of one reward gets A = 0.
- ``centred`` (Dr. GRPO; Reinforce-Ada's r - p_hat): A_i = r_i - b, with b the group mean or a
  baseline estimated from a larger pool.
- ``rloo``: A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean r).
- ``raft``: A_i = r_i (rejection sampling: train only on accepted samples).

- ``pool_standardised`` / ``pool_advantages`` (Reinforce-Ada's global statistics, chapter 6): the
  baseline and the std of a larger pool of N rollouts that was binarised at a success threshold,
  A_i = (r_i - p_hat) / (s + eps) with s = max(sqrt(p_hat (1 - p_hat) N / (N - 1)), 1 / sqrt(N)).
  The one function the trainer, Ada-Seq's exact analysis and the verl estimator all call.

Every one is zero on a group whose rewards are all equal except ``raft`` on an all-correct group,
which is the point of chapter 1.

Bounds (:func:`advantage_bound`), for any rewards in [0, 1] and any pool statistics: ``standardised``
|A| <= (n - 1) / sqrt(n) (Samuelson's inequality, with the Bessel std), ``pool_standardised``
|A| <= sqrt(N), ``centred`` |A| <= 1, ``rloo`` |A| <= n / (n - 1). A group weight multiplies them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import math

import numpy as np

from rlcurate._validate import as_finite

__all__ = ["standardised", "centred", "rloo", "raft", "pool_standardised", "pool_advantages", "advantage_bound",
           "ADVANTAGES", "advantages_by_group"]


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


def pool_standardised(r, p_hat, pool_size, eps: float = 1e-6) -> np.ndarray:
    """GRPO standardised with the statistics of a larger pool (Reinforce-Ada's ``global_stat_est``,
    chapter 6): A = (r - p_hat) / (s + eps), where p_hat = N_pos / N is the pass rate of the pool of
    N = ``pool_size`` rollouts binarised at the success threshold and

        s = max(sqrt(p_hat (1 - p_hat) N / (N - 1)), 1 / sqrt(N)),

    the Bessel std of N_pos ones and N - N_pos zeros, floored at 1 / sqrt(N). The rewards r themselves
    are not binarised: a graded reward enters with its value. ``p_hat`` and ``pool_size`` may be
    arrays that broadcast against ``r`` (one per reward).

    Against the official code (RLHFlow/Reinforce-Ada ``core_algos.compute_grpo_outcome_advantage``
    with ``global_stat_est``, which clamps the std at eps instead): for a pool with both classes the
    two agree exactly, since such a pool's std is at least 1 / sqrt(N) (one success in N). They
    differ only on a pool of one class with graded kept rewards, where the official advantage is
    (r - p_hat) / (2 eps), e.g. 0.1 / 2e-6 = 50000 for a formatted-but-wrong Countdown answer in a pool
    without successes; here it is (r - p_hat) sqrt(N) / (1 + eps sqrt(N)), so |A| <= sqrt(N) for any
    rewards in [0, 1] and any pool statistics, and with 0/1 rewards such a pool gives A = 0. A pool of
    one rollout (or none) gives A = 0 (official: mean 0, std 1, so A = r / (1 + eps)).
    """
    r = _rewards(r)
    p = np.asarray(p_hat, dtype=float)
    n = np.asarray(pool_size, dtype=float)
    std = np.sqrt(np.maximum(p * (1.0 - p) * n / np.maximum(n - 1, 1), 0.0))
    floor = 1.0 / np.sqrt(np.maximum(n, 1))
    return np.where(n <= 1, 0.0, (r - p) / (np.maximum(std, floor) + eps))


def pool_advantages(r, p_hat, pool_size, kind: str = "grpo", eps: float = 1e-6) -> np.ndarray:
    """The advantage of a kept group with the baseline of its pool (chapter 6): ``grpo``
    :func:`pool_standardised`, ``drgrpo`` r - p_hat (Reinforce-Ada's ``norm_adv_by_std_in_grpo=False``).
    A pool of one rollout gives A = 0 under both. The one implementation the trainer, Ada-Seq's exact
    analysis (:func:`rlcurate.curation.ada.seq_effective_weight`) and the verl estimator
    (:func:`rlcurate.interop.verl.pool_baseline_advantage`) use."""
    if kind == "grpo":
        return pool_standardised(r, p_hat, pool_size, eps)
    if kind == "drgrpo":
        r = _rewards(r)
        return np.where(np.asarray(pool_size) <= 1, 0.0, r - np.asarray(p_hat, dtype=float))
    raise ValueError(f"a pool baseline needs advantage 'grpo' or 'drgrpo', got {kind!r}")


def advantage_bound(kind: str, n: int, pool_size: int | None = None) -> float:
    """The largest |A| that rewards in [0, 1] can produce for a group of ``n`` (with the statistics of a
    pool of ``pool_size`` for ``grpo``/``drgrpo`` when given), before the group weight: ``grpo``
    (n - 1) / sqrt(n), with a pool sqrt(N); ``drgrpo`` 1; ``rloo`` n / (n - 1); ``raft`` 1."""
    if kind in ("grpo", "standardised"):
        if pool_size is not None:
            return math.sqrt(max(int(pool_size), 1))
        return (n - 1) / math.sqrt(n) if n > 1 else 0.0
    if kind in ("drgrpo", "centred", "raft"):
        return 1.0
    if kind == "rloo":
        return n / (n - 1) if n > 1 else 0.0
    raise ValueError(f"kind must be one of {sorted(ADVANTAGES)}, got {kind!r}")


ADVANTAGES = {"standardised": standardised, "grpo": standardised, "centred": centred,
              "drgrpo": centred, "rloo": rloo, "raft": raft}


def advantages_by_group(groups: Iterable[Sequence[float]], kind: str = "grpo", **kwargs) -> list[np.ndarray]:
    """Apply one advantage rule to each group of a (possibly ragged) batch."""
    if kind not in ADVANTAGES:
        raise ValueError(f"kind must be one of {sorted(ADVANTAGES)}, got {kind!r}")
    fn = ADVANTAGES[kind]
    return [fn(g, **kwargs) for g in groups]
