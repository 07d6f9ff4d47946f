"""Values a chapter records for the tests to assert on.

``record(name, value)`` displays a small JSON bundle under a custom MIME type. It stays in the
executed notebook's outputs (papermill, nbclient) without showing in the rendered book, and
:func:`read_records` collects them from an executed ``.ipynb`` file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

MIME_TYPE = "application/vnd.rlcurate.record+json"


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


def record(name: str, value: Any) -> None:
    """Store ``value`` (numbers, strings, lists, dicts, numpy arrays) under ``name`` in the outputs."""
    from IPython.display import display

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    display({MIME_TYPE: {"name": name, "value": _jsonable(value)}}, raw=True)


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
