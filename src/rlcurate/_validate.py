"""Input checks shared by the package: every bad input raises ``ValueError`` naming the argument
and the offending value, so that a user sees at once what to fix."""

from __future__ import annotations

import numbers

import numpy as np


def _first_bad(arr: np.ndarray, bad: np.ndarray):
    return arr[bad].flat[0] if arr.ndim else arr.item()


def as_probability(p, name: str = "p") -> np.ndarray:
    """Return ``p`` as a float array, raising ``ValueError`` unless every entry lies in [0, 1]."""
    try:
        arr = np.asarray(p, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number or an array of numbers in [0, 1], got {p!r}") from exc
    nan = np.isnan(arr)
    if nan.any():
        raise ValueError(f"{name} must not contain NaN, got {p!r}")
    bad = (arr < 0) | (arr > 1)
    if bad.any():
        raise ValueError(f"{name} must lie in [0, 1], got {_first_bad(arr, bad)!r}")
    return arr


def as_int(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as a Python int, raising ``ValueError`` if it is not an integer in range."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def as_int_array(values, name: str, minimum: int | None = None) -> np.ndarray:
    """Return ``values`` as an int64 array, raising ``ValueError`` on non-integers or values below ``minimum``."""
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        if np.isnan(arr).any():
            raise ValueError(f"{name} must not contain NaN, got {values!r}")
        if not np.all(np.mod(arr, 1) == 0):
            raise ValueError(f"{name} must hold integers, got {values!r}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got {values!r}")
    arr = arr.astype(np.int64)
    if minimum is not None and (arr < minimum).any():
        raise ValueError(f"{name} must be >= {minimum}, got {_first_bad(arr, arr < minimum)!r}")
    return arr


def as_finite(value, name: str, positive: bool = False, nonnegative: bool = False) -> np.ndarray:
    """Return ``value`` as a float array, raising ``ValueError`` on NaN, infinity or a wrong sign."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric, got {value!r}") from exc
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite (no NaN or infinity), got {value!r}")
    if positive and (arr <= 0).any():
        raise ValueError(f"{name} must be > 0, got {_first_bad(arr, arr <= 0)!r}")
    if nonnegative and (arr < 0).any():
        raise ValueError(f"{name} must be >= 0, got {_first_bad(arr, arr < 0)!r}")
    return arr


def as_scalar(value, name: str) -> float:
    """``value`` as one finite float, raising ``ValueError`` for an array of several, a non-number or NaN."""
    arr = as_finite(value, name)
    if arr.size != 1:
        raise ValueError(f"{name} must be one number, got an array of shape {arr.shape}")
    return float(arr.reshape(()))


def scalar_or_array(arr: np.ndarray, like):
    """Return a Python float when the input was a scalar, else the array."""
    return float(arr) if np.ndim(like) == 0 else arr


def binom_pmf(G: int, p: np.ndarray) -> np.ndarray:
    """P(S = k) for S ~ Binomial(G, p), k = 0..G, shape (len(p), G + 1). Computed in log space with
    xlogy (0 log 0 = 0), so it is exact at p = 0 and p = 1, and never overflows for large G or tiny p."""
    from scipy.special import gammaln, xlog1py, xlogy

    p = np.asarray(p, dtype=float).reshape(-1, 1)
    k = np.arange(G + 1)[None, :]
    log_coef = gammaln(G + 1) - gammaln(k + 1) - gammaln(G - k + 1)
    with np.errstate(divide="ignore"):
        return np.exp(log_coef + xlogy(k, p) + xlog1py(G - k, -p))
