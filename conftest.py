"""Shared test set-up: real datasets from ../shared/data, a quiet non-interactive matplotlib, two CPU
threads (the machines this project is tested on have two cores) or one in each pytest-xdist worker, each
chapter's tests on one worker, and nbval comparing recorded values
with a tolerance (see :func:`_compare_records_with_tolerance`) against the chapter tests/test_notebooks.py
already executed in the session, where it did (see :func:`_reuse_executed_copy`)."""

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


def work_unit(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole (`make test`): a chapter's execution
    (tests/test_notebooks.py) with nbval's comparisons of its cells, in that order (nbval reads the copy executed
    there); each replay of a committed run alone, and so the replays on another kernel path (in their module, the
    first unit handed out, they read SmolLM2's GGUF file themselves before the export test had made the cache: 89 s
    against about 55; alone they are handed out later, :func:`hand_out_order`); any other test with its module (a
    module's fixtures are set up once)."""
    path, _, name = nodeid.partition("::")
    if path.endswith(".ipynb"):
        return f"chapter {Path(path).stem}"
    if path == "tests/test_notebooks.py" and name.startswith("test_chapter_executes_and_records["):
        return f"chapter {name.split('[', 1)[1].rstrip(']')}"
    if path == "tests/test_replay.py" and (name.startswith("test_a_committed_run_replays_teacher_forced[")
                                           or name == "test_replays_hold_on_another_kernel_path"):
        return nodeid
    return path


# Units handed out first: SmolLM2's export test reads the GGUF file into a folder of its own and offers its export as
# the cache every other SmolLM2 test loads (tests/test_hf_models.py); started first, it usually finishes before any
# other SmolLM2 test needs the cache, which would otherwise read the GGUF file a second time (40-50 s) on a fresh machine.
FIRST_UNITS = ("tests/test_hf_models.py",)


def long_single_test(unit: str) -> bool:
    """A unit of one test that takes half a minute or more: SmolLM2's replays and the replays on another kernel path.
    xdist hands out the units with the most tests first, which would put these last, where one of them keeps a
    worker busy after the other has finished; they are handed out just before the other units of one test instead
    (short replays and modules of one test, which even out the end of the run)."""
    return (unit == "tests/test_replay.py::test_replays_hold_on_another_kernel_path"
            or unit.startswith("tests/test_replay.py::test_a_committed_run_replays_teacher_forced[smollm2"))


def hand_out_order(units: list[tuple[str, int]]) -> list[str]:
    """The order in which the workers get the units, from ``(unit, number of tests)`` in xdist's order (most tests
    first): :data:`FIRST_UNITS`, then xdist's order with the :func:`long_single_test` units moved to just before the
    other units of one test."""
    first = [u for u in FIRST_UNITS if u in dict(units)]
    rest = [(u, n) for u, n in units if u not in FIRST_UNITS and not long_single_test(u)]
    tail = next((i for i, (_, n) in enumerate(rest) if n == 1), len(rest))
    long = [u for u, _ in units if u not in FIRST_UNITS and long_single_test(u)]
    return first + [u for u, _ in rest[:tail]] + long + [u for u, _ in rest[tail:]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler, with the units of :func:`work_unit` (its ``loadgroup`` marks no longer reach the
    scheduler under pytest 9)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_ordered", False):  # once, on xdist's order
                self._ordered = True
                units = dict(self.workqueue)
                self.workqueue.clear()
                for unit in hand_out_order([(u, len(tests)) for u, tests in units.items()]):
                    self.workqueue[unit] = units[unit]
            super()._assign_work_unit(node)

    return ByWorkUnit(config, log)


EXECUTED = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def executed_notebooks(request) -> dict:
    """``{source notebook path: its executed copy}`` for the chapters tests/test_notebooks.py executed in this
    session (the smoke profile, as nbval runs them); nbval compares their stored outputs with that copy
    instead of executing the chapter a second time."""
    return request.config.stash.setdefault(EXECUTED, {})


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_the_sessions_folder(tmp_path_factory):
    """Every temporary file the package, a chapter's kernel or a subprocess makes (``tempfile``, ``TMPDIR``) goes
    under pytest's folder for this session, which pytest removes when every test passes
    (``tmp_path_retention_policy`` in pyproject.toml): a run of the suite leaves nothing in the system's /tmp."""
    import tempfile

    folder = tmp_path_factory.mktemp("tempfile")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    yield folder
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


# One CPU thread per process when pytest-xdist runs the tests on several workers (`make test`: one per core). Two
# workers of one thread each use both cores of a 2-core machine where one process of two threads idles one core for
# most of the suite (a chapter's kernel, scipy and the simulations run on one); and a thread that busy-waits for
# work while the other worker holds the core slows both by up to six times (OpenBLAS in scipy's L-BFGS-B), so the
# OpenMP, MKL and OpenBLAS pools are held to one thread and OpenMP waits passively.
_ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                   "OMP_WAIT_POLICY": "PASSIVE"}


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None):  # pytest-xdist's controller: its workers inherit this environment
        os.environ.update(_ONE_THREAD_ENV)
    try:
        import torch

        torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # two cores, or one per worker
    except ImportError:  # the statistics core is usable without torch
        pass
    try:
        from nbval.plugin import IPyNbCell, IPyNbFile
    except ImportError:  # nbval is a dev extra
        return
    originals = [(IPyNbCell, "compare_outputs", IPyNbCell.compare_outputs), (IPyNbCell, "runtest", IPyNbCell.runtest),
                 (IPyNbFile, "setup", IPyNbFile.setup)]
    IPyNbCell.compare_outputs = _compare_records_with_tolerance(IPyNbCell.compare_outputs)
    IPyNbFile.setup, IPyNbCell.runtest = _reuse_executed_copy(IPyNbFile.setup, IPyNbCell.runtest)
    config.add_cleanup(lambda: [setattr(cls, name, fn) for cls, name, fn in originals])


def _reuse_executed_copy(file_setup, cell_runtest):
    """nbval's ``IPyNbFile.setup`` and ``IPyNbCell.runtest``, reading a chapter's fresh outputs from the copy that
    tests/test_notebooks.py executed in this session (:func:`executed_notebooks`), cell by cell id, instead of
    starting a kernel and executing it again; as before for a chapter it has not executed (run alone, or it
    failed there). The checks are nbval's own: an error output fails the cell, a reference cell that never ran
    must have no outputs, and tagged cells are compared by ``compare_outputs`` (sanitized, records with a
    tolerance)."""

    def setup(self):
        executed = self.config.stash.get(EXECUTED, {}).get(Path(str(self.fspath)).resolve())
        if executed is None:
            return file_setup(self)
        import nbformat

        self.executed_cells = {cell.get("id"): cell for cell in nbformat.read(str(executed), as_version=4).cells}
        self.setup_sanitize_files()

    def runtest(self):
        cells = getattr(self.parent, "executed_cells", None)
        if cells is None:
            return cell_runtest(self)
        from nbval.plugin import coalesce_streams

        if self.options["skip"]:
            pytest.skip()
        ran = cells.get(self.cell.get("id"))
        if ran is None:
            self.raise_cell_error(f"cell id {self.cell.get('id')!r} is not in the executed copy")
        outs = coalesce_streams(list(ran.get("outputs", [])))
        self.test_outputs = outs
        errors = [o for o in outs if o.get("output_type") == "error"]
        if errors:
            self.raise_cell_error(f"{errors[0].get('ename')}: {errors[0].get('evalue')}")
        unrun = self.cell.execution_count is None
        if unrun and self.cell.outputs:
            self.raise_cell_error("Unrun reference cell has outputs")
        if self.options["check"] and not unrun and not self.compare_outputs(outs, coalesce_streams(self.cell.outputs)):
            self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))

    return setup, runtest


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
