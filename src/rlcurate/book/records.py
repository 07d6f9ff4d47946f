"""Values a chapter records for the tests to assert on.

``record(name, value)`` displays a small JSON bundle under a custom MIME type. It stays in the
executed notebook's outputs (papermill, nbclient) without showing in the rendered book, and
:func:`read_records` collects them from an executed ``.ipynb`` file.

nbval compares the bundles of the cells tagged ``nbval-check-output`` with their stored ones through
:func:`compare_bundles` (hooked in by the repository's root ``conftest.py``), never bit for bit: the last
bits of a float depend on the processor, its BLAS kernel and the thread count.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

MIME_TYPE = "application/vnd.rlcurate.record+json"

RTOL = 1e-9
"""Relative tolerance of a recorded float: far above the few ulps (2.2e-16 each) by which a BLAS
kernel, a vectorised ``exp`` or a summation order moves a double, far below any digit a chapter reads."""

ATOL = 1e-12
"""Absolute floor: a value below it next to O(1) inputs is double rounding error by nature (chapter 5's
``grpo_weight_max_err`` is 3.6e-15 under one BLAS kernel and 1.3e-14 under another). Values that are
float32 rounding error (an autograd-vs-formula gap of 1e-8 through float32 log-probabilities) record
their own, looser ``atol``."""


def _jsonable(value: Any):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"cannot record a non-finite number ({v})")
        return v
    if isinstance(value, (int, str)) or value is None:
        return value
    raise ValueError(f"cannot record a value of type {type(value).__name__}")


def _check_atol(atol) -> float | dict[str, float] | None:
    if atol is None:
        return None
    items = atol.items() if isinstance(atol, Mapping) else [(None, atol)]
    for key, tol in items:
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0 <= tol < math.inf):
            raise ValueError(f"atol must be a finite number >= 0, or a mapping of keys to such numbers, got {atol!r}")
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"atol's keys must be non-empty strings, got {key!r}")
    return {k: float(v) for k, v in atol.items()} if isinstance(atol, Mapping) else float(atol)


def record(name: str, value: Any, atol: float | Mapping[str, float] | None = None) -> None:
    """Store ``value`` (numbers, strings, lists, dicts, numpy arrays) under ``name`` in the outputs.

    ``atol`` replaces the absolute floor (default :data:`ATOL`) of the stored-vs-new comparison for values
    that are rounding error by nature: a number applies to every float of the record, a mapping
    ``{key: atol}`` to the floats under that dict key at any depth. It is stored in the bundle.
    """
    from IPython.display import display

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    bundle = {"name": name, "value": _jsonable(value)}
    if atol is not None:
        bundle["atol"] = _check_atol(atol)
    display({MIME_TYPE: bundle}, raw=True)


def _kind(x) -> str:
    for kind in (bool, int, float, str, Mapping, list):
        if isinstance(x, kind):
            return kind.__name__
    return "None" if x is None else type(x).__name__


def _compare(a, b, path: str, rtol: float, atol: float, atol_by_key: Mapping[str, float], out: list[str]) -> None:
    where = path or "value"
    if _kind(a) != _kind(b):
        out.append(f"{where}: stored {a!r} ({_kind(a)}), new {b!r} ({_kind(b)})")
    elif isinstance(a, Mapping):
        if set(a) != set(b):
            missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            out.append(f"{where}: keys differ (missing in new: {missing}, new only: {extra})")
        for key in sorted(set(a) & set(b)):
            _compare(a[key], b[key], f"{path}[{key!r}]", rtol, atol_by_key.get(key, atol), atol_by_key, out)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{where}: stored {len(a)} items, new {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{path}[{i}]", rtol, atol, atol_by_key, out)
    elif isinstance(a, float):
        bound = max(rtol * max(abs(a), abs(b)), atol)
        if not abs(a - b) <= bound:
            out.append(f"{where}: stored {a!r}, new {b!r}: differ by {abs(a - b):.3g} > {bound:.3g}")
    elif a != b:
        out.append(f"{where}: stored {a!r}, new {b!r}")


def compare_records(stored: Any, new: Any, rtol: float = RTOL,
                    atol: float | Mapping[str, float] | None = None) -> list[str]:
    """The differences between a stored and a newly computed record value, one line each (empty: equal).

    Floats are equal when ``|a - b| <= max(rtol * max(|a|, |b|), atol)``; ``atol`` is :data:`ATOL`, a
    number, or a mapping ``{key: atol}`` for the floats under those dict keys (the rest keep :data:`ATOL`).
    Integers, strings, booleans and ``None`` must be equal, and a float never equals an integer. Dicts
    must have the same keys, in any order; lists the same length, compared item by item.
    """
    default, by_key = ATOL, {}
    if isinstance(atol, Mapping):
        by_key = dict(atol)
    elif atol is not None:
        default = float(atol)
    out: list[str] = []
    _compare(stored, new, "", rtol, default, by_key, out)
    return out


def compare_bundles(stored: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The differences between two displayed record bundles: the names and tolerances exactly, the values
    by :func:`compare_records` under the new bundle's ``atol``."""
    out = []
    for key in ("name", "atol"):
        if stored.get(key) != new.get(key):
            out.append(f"{key}: stored {stored.get(key)!r}, new {new.get(key)!r}")
    name = new.get("name", "?")
    diffs = compare_records(stored.get("value"), new.get("value"), atol=new.get("atol"))
    return out + [f"record {name!r}: {d}" for d in diffs]


def read_records(notebook: str | Path) -> dict[str, Any]:
    """All values recorded in an executed notebook, by name (a later record of a name wins)."""
    nb = json.loads(Path(notebook).read_text())
    out: dict[str, Any] = {}
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            data = output.get("data", {})
            if MIME_TYPE in data:
                item = data[MIME_TYPE]
                if isinstance(item, str):
                    item = json.loads(item)
                out[item["name"]] = item["value"]
    return out
