"""Recorded values are compared with a tolerance (rlcurate.book.records.compare_records), and nbval uses
it for the record outputs of the chapters' checked cells (the hook in the root conftest.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from rlcurate.book.records import ATOL, MIME_TYPE, RTOL, compare_bundles, compare_records, record

REPO = Path(__file__).resolve().parents[1]

# Chapter 5's records on two processors (issue #12) or under two OpenBLAS kernels (OPENBLAS_CORETYPE)
LAST_BITS = [(0.020210599041232465, 0.02021059904123246),       # var_rloo: stored vs an AMD EPYC core
             (1.0097483260987361e-08, 1.0097483195067869e-08),  # grad_err_forward: idem
             (3.635980405647388e-15, 1.2878587085651816e-14),   # grpo_weight_max_err: default vs Sandybridge
             (0.7499999999999999, 0.7499999999999997)]          # drgrpo_ratio: idem


def sixth_digit(x: float) -> float:
    """x with its 6th significant digit moved by one."""
    return x + 10.0 ** (math.floor(math.log10(abs(x))) - 5)


def ulps(x: float, n: int) -> float:
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


@pytest.mark.parametrize("stored, new", LAST_BITS)
def test_processor_differences_of_the_issue_pass(stored, new):
    assert stored != new
    assert compare_records(stored, new) == []
    assert compare_records({"v": [stored]}, {"v": [new]}) == []


@pytest.mark.parametrize("x", [0.0006482173038659857, 0.02021059904123246, 0.7499999999999999, 1.2740740562754649,
                               63.984374923298645, 1095.0, -2.475, 3.5e7])
def test_last_bits_pass_and_the_sixth_digit_fails(x):
    for n in (1, -1, 8, -8):
        assert compare_records(x, ulps(x, n)) == []
    differences = compare_records(x, sixth_digit(x))
    assert len(differences) == 1 and repr(x) in differences[0]
    assert compare_records({"kl": [{"x": x}]}, {"kl": [{"x": sixth_digit(x)}]}) == [
        differences[0].replace("value", "['kl'][0]['x']")]


def test_the_absolute_floor():
    # rounding error by nature: rloo_max_err is 4.9e-17 under one OpenBLAS kernel, 8.3e-17 under another
    assert compare_records(4.85722573273506e-17, 8.326672684688674e-17) == []
    assert compare_records(0.0, 3e-13) == []
    assert compare_records(0.0, 3e-12) != []                    # above ATOL
    assert compare_records(2.1571864683433972e-08, 2.2e-08) != []
    assert RTOL == 1e-9 and ATOL == 1e-12


def test_a_per_key_floor_applies_under_its_key_only():
    stored = {"clip": {"fd_err": 2.1571864683433972e-08, "grad_err": 0.0, "fd": [2.2e-8]}}
    atol = {"fd_err": 1e-6}
    assert compare_records(stored, {"clip": {"fd_err": 5e-7, "grad_err": 0.0, "fd": [2.2e-8]}}, atol=atol) == []
    assert compare_records(stored, {"clip": {"fd_err": 2e-6, "grad_err": 0.0, "fd": [2.2e-8]}}, atol=atol) != []
    assert compare_records(stored, {"clip": {"fd_err": 2.2e-8, "grad_err": 0.0, "fd": [5e-7]}}, atol=atol) != []
    assert compare_records(stored, {"clip": {"fd_err": 2.2e-8, "grad_err": 2e-12, "fd": [2.2e-8]}}, atol=atol) != []
    assert compare_records([0.1, 0.2], [0.1 + 1e-7, 0.2], atol=1e-6) == []   # a number: every float


def test_key_order_does_not_matter_but_the_key_set_does():
    a = {"T": 172, "N": 12, "filter_gain": 1.2740740562754649, "length_bias": 1.4666666584710282}
    b = dict(reversed(list(a.items())))
    assert list(a) != list(b) and compare_records(a, b) == []
    assert compare_records(a, {**b, "extra": 1}) == ["value: keys differ (missing in new: [], new only: ['extra'])"]
    assert compare_records(a, {k: v for k, v in b.items() if k != "T"}) != []


@pytest.mark.parametrize("stored, new", [(172, 173), (3, 3.0), (True, 1), (False, 0.0), ("sage", "sage "),
                                         (None, 0), (None, "None"), ([1, 2], [1, 2, 3]), ({"a": 1}, [1]),
                                         ([[1, 2.0]], [[1, 2]])])
def test_integers_strings_booleans_and_shapes_are_exact(stored, new):
    assert compare_records(stored, new) != []
    assert compare_records(stored, stored) == []


def test_nested_differences_name_their_path():
    stored = [{"distance": 0.05, "kl": 0.0006482173038659857, "tags": ["a", 1]},
              {"distance": 0.1, "kl": 0.002597361045427019, "tags": ["b", 2]}]
    new = json.loads(json.dumps(stored))
    new[1]["kl"] = sixth_digit(new[1]["kl"])
    new[0]["tags"][1] = 3
    assert [d.split(":")[0] for d in compare_records(stored, new)] == ["[0]['tags'][1]", "[1]['kl']"]


def test_bundles_compare_names_and_tolerances_exactly():
    b = {"name": "clip", "value": {"fd_err": 2.2e-8}, "atol": {"fd_err": 1e-6}}
    assert compare_bundles(b, {**b, "value": {"fd_err": 5e-7}}) == []
    assert compare_bundles(b, {**b, "name": "kl"}) == ["name: stored 'clip', new 'kl'"]
    assert compare_bundles(b, {**b, "atol": {"fd_err": 1e-5}}) != []
    assert compare_bundles({"name": "x", "value": 1.0}, {"name": "x", "value": sixth_digit(1.0)}) != []


def test_record_stores_its_tolerance(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    record("clip", {"fd_err": 2e-8, "n": 3}, atol={"fd_err": 1e-6})
    record("kl", [0.5])
    assert shown == [{MIME_TYPE: {"name": "clip", "value": {"fd_err": 2e-8, "n": 3}, "atol": {"fd_err": 1e-6}}},
                     {MIME_TYPE: {"name": "kl", "value": [0.5]}}]
    for bad in (-1.0, math.nan, math.inf, "1e-6", True, {"fd_err": -1.0}, {"": 1e-6}):
        with pytest.raises(ValueError, match="atol"):
            record("clip", 1.0, atol=bad)


def _notebook(path: Path, stored_value: float, new_value: float, stored_line: str = "graded rewards") -> None:
    """A one-cell notebook whose checked cell prints "graded rewards" and records new_value; the stored
    outputs hold stored_line and stored_value."""
    cell = nbformat.v4.new_code_cell(
        "# NBVAL_CHECK_OUTPUT\nfrom rlcurate.book import record\nprint('graded rewards')\n"
        f"record('advantages', {{'var_rloo': {new_value!r}, 'T': 172}})", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored_line + "\n"),
                    nbformat.v4.new_output("display_data", data={
                        MIME_TYPE: {"name": "advantages", "value": {"T": 172, "var_rloo": stored_value}}})]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_nbval_compares_records_with_the_tolerance(tmp_path):
    stored, last_bits = LAST_BITS[0]
    _notebook(tmp_path / "last_bits.ipynb", stored, last_bits)
    _notebook(tmp_path / "sixth_digit.ipynb", stored, sixth_digit(stored))
    _notebook(tmp_path / "printed.ipynb", stored, stored, stored_line="graded rewards!")   # the rest: as before
    (tmp_path / "conftest.py").write_text((REPO / "conftest.py").read_text())   # the hook under test
    (tmp_path / "pytest.ini").write_text("[pytest]\n")   # no settings from any folder above
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
                          "--nbval-lax", "--nbval-current-env", "last_bits.ipynb", "sixth_digit.ipynb",
                          "printed.ipynb"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert "PASSED last_bits.ipynb::Cell 0" in out, out
    assert "FAILED sixth_digit.ipynb::Cell 0" in out, out
    assert "FAILED printed.ipynb::Cell 0" in out and "mismatch 'stdout'" in out
    assert "recorded values differ beyond their tolerance" in out
    assert f"record 'advantages': ['var_rloo']: stored {stored!r}, new {sixth_digit(stored)!r}" in out
    assert run.returncode == 1
