"""Shared test set-up: real datasets from ../shared/data, a quiet non-interactive matplotlib, two CPU
threads (the machines this project is tested on have two cores), and nbval comparing recorded values
with a tolerance (see :func:`_compare_records_with_tolerance`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("RLCURATE_DATA_DIR", str(SHARED_DATA))
os.environ.setdefault("RLCURATE_PROFILE", "smoke")  # nbval executes the chapters in this profile
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _checks_no_output(nb: Path) -> bool:
    """True for a chapter none of whose cells nbval compares (no ``# NBVAL_CHECK_OUTPUT`` comment and no
    ``nbval-check-output`` tag): under ``--nbval-lax`` nbval would only execute it, which
    tests/test_notebooks.py does already."""
    import json

    try:
        cells = json.loads(nb.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return False  # let nbval report what is wrong with it
    return not any("NBVAL_CHECK_OUTPUT" in "".join(c.get("source", ""))
                   or "nbval-check-output" in c.get("metadata", {}).get("tags", []) for c in cells)


# nbval runs the chapters whose stored outputs it compares; executing the others a second time checks nothing new
collect_ignore = [str(nb) for nb in sorted((REPO / "book").glob("*.ipynb")) if _checks_no_output(nb)]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_configure(config):
    try:
        import torch

        torch.set_num_threads(2)
    except ImportError:  # the statistics core is usable without torch
        pass
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval is a dev extra
        return
    original = IPyNbCell.compare_outputs
    IPyNbCell.compare_outputs = _compare_records_with_tolerance(original)
    config.add_cleanup(lambda: setattr(IPyNbCell, "compare_outputs", original))


def _split_records(outputs):
    """(the record bundles of a cell's outputs in order, the outputs without them)."""
    import copy
    import json

    from rlcurate.book.records import MIME_TYPE

    bundles, rest = [], []
    for output in outputs:
        data = output.get("data", {})
        if MIME_TYPE not in data:
            rest.append(output)
            continue
        bundle = data[MIME_TYPE]
        bundles.append(json.loads(bundle) if isinstance(bundle, str) else bundle)
        if len(data) > 1:  # other MIME types of the same output are compared as before
            output = copy.copy(output)
            output["data"] = {k: v for k, v in data.items() if k != MIME_TYPE}
            rest.append(output)
    return bundles, rest


def _compare_records_with_tolerance(compare_outputs):
    """nbval's ``IPyNbCell.compare_outputs`` with the record bundles (MIME type ``rlcurate.book.MIME_TYPE``)
    taken out of both output lists and compared in order by ``rlcurate.book.records.compare_bundles``:
    floats to a relative 1e-9 over an absolute floor, integers and strings exactly, dict keys in any order.
    nbval compares every other output as before (exactly, after tests/nbval_sanitize.cfg)."""

    def compare(self, test, ref, skip_compare=None):
        from rlcurate.book.records import compare_bundles

        test_bundles, test = _split_records(test)
        ref_bundles, ref = _split_records(ref)
        if not compare_outputs(self, test, ref, skip_compare):
            return False
        if len(ref_bundles) != len(test_bundles):
            problems = [f"{len(ref_bundles)} records stored, {len(test_bundles)} recorded"]
        else:
            problems = [p for old, new in zip(ref_bundles, test_bundles) for p in compare_bundles(old, new)]
        if problems:
            self.comparison_traceback += ["recorded values differ beyond their tolerance:", *problems]
        return not problems

    return compare
