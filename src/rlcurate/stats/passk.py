"""pass@k: the chance that at least one of k samples is correct (chapter 1, *The gate*).

From n samples of which c are correct, the unbiased estimator of pass@k (Chen et al., 2021) is

    pass@k = 1 - C(n - c, k) / C(n, k),

computed here as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms a large binomial coefficient.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlcurate._validate import as_int, as_probability, scalar_or_array

__all__ = ["pass_at_k", "pass_at_k_curve", "pass_at_k_exact"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (chapter 1). Requires 1 <= k <= n, 0 <= c <= n."""
    n = as_int(n, "n", minimum=1)
    c = as_int(c, "c", minimum=0, maximum=n)
    k = as_int(k, "k", minimum=1, maximum=n)
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_exact(p, k: int):
    """pass@k of a prompt with true pass rate p: 1 - (1 - p)^k (chapter 1)."""
    p_arr = as_probability(p, "p")
    k = as_int(k, "k", minimum=1)
    with np.errstate(divide="ignore"):
        return scalar_or_array(-np.expm1(k * np.log1p(-p_arr)), p)


def pass_at_k_curve(scores: Sequence[Sequence[float]], ks: Sequence[int] | None = None, threshold: float = 1.0) -> dict:
    """Mean unbiased pass@k over prompts from a score matrix (rows may have different lengths).

    A run counts as correct when its score is >= ``threshold``. ``ks`` defaults to the powers of two
    up to the shortest row. Returns ``{"k": array, "pass_at_k": array}``.
    """
    rows = [np.asarray(r, dtype=float) for r in scores]
    if not rows:
        raise ValueError("scores must hold at least one row, got none")
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"scores row {i} must be a non-empty 1-D sequence, got shape {r.shape}")
        if np.isnan(r).any():
            raise ValueError(f"scores row {i} contains NaN")
    n_min = min(r.size for r in rows)
    if ks is None:
        ks = [2**j for j in range(int(np.log2(n_min)) + 1)]
    ks = [as_int(k, "k", minimum=1) for k in ks]
    too_big = [k for k in ks if k > n_min]
    if too_big:
        raise ValueError(f"ks must not exceed the fewest runs of any row ({n_min}), got {too_big[0]}")
    counts = [(r.size, int((r >= threshold).sum())) for r in rows]
    curve = np.array([np.mean([pass_at_k(n, c, k) for n, c in counts]) for k in ks])
    return {"k": np.asarray(ks), "pass_at_k": curve}
