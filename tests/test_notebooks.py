"""Chapters as tests.

Every chapter in book/ is executed once with papermill in the ``smoke`` profile, into a temporary
folder (never over the source). The values it stored with :func:`rlcurate.book.record` are then
checked by ``tests/chapter_checks/<chapter>.py`` (a function ``check(records)``), and every chapter
must record ``checks_passed`` (its numerical assertions all ran). A separate test makes sure no
committed notebook holds an error output. nbval (``--nbval-lax``, configured in pyproject.toml) runs
the chapters that have cells tagged ``nbval-check-output`` and compares those cells with their stored
outputs (the root conftest.py leaves the others to this file); it reads the fresh outputs from the copy
executed here, so no chapter runs twice in one session.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
import time
from pathlib import Path

import pytest

from rlcurate.book import read_records

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((REPO / "book").glob("[0-9][0-9]_*.ipynb")) + sorted((REPO / "book").glob("A[0-9]_*.ipynb"))
CHECKS = REPO / "tests" / "chapter_checks"
SMOKE_BUDGET_S = 600  # per cell; the aim is well under a minute per chapter

_executed: dict[str, tuple[Path, float]] = {}


def _execute(nb: Path, out_dir: Path) -> tuple[Path, float]:
    import papermill as pm

    if nb.stem not in _executed:
        out = out_dir / nb.name
        scratch = Path(tempfile.gettempdir())  # the session's folder (root conftest.py); the kernel inherits TMPDIR
        before = set(scratch.glob("rlcurate-*"))
        start = time.perf_counter()
        pm.execute_notebook(str(nb), str(out), parameters={"PROFILE": "smoke"}, kernel_name="python3",
                            cwd=str(nb.parent), progress_bar=False, log_output=False,
                            execution_timeout=SMOKE_BUDGET_S)
        _executed[nb.stem] = (out, time.perf_counter() - start)
        left = sorted(p.name for p in set(scratch.glob("rlcurate-*")) - before)
        assert not left, f"{nb.name} left its scratch folders behind: {left} (rlcurate.book.scratch_dir)"
    return _executed[nb.stem]


@pytest.fixture(scope="session")
def executed_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("executed_chapters")


@pytest.mark.notebook
@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes_and_records(nb: Path, executed_dir: Path, executed_notebooks: dict):
    out, seconds = _execute(nb, executed_dir)
    executed_notebooks[nb.resolve()] = out  # nbval compares its tagged cells with this copy
    records = read_records(out)
    assert records.get("checks_passed") is True, f"{nb.name} did not record checks_passed=True"
    assert records.get("profile") == "smoke", f"{nb.name} ran in profile {records.get('profile')!r}"
    check_file = CHECKS / f"{nb.stem}.py"
    if check_file.exists():
        spec = importlib.util.spec_from_file_location(f"chapter_check_{nb.stem}", check_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.check(records)
    print(f"{nb.stem}: smoke {seconds:.1f} s")


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.stem)
def test_committed_notebook_has_no_error_output_and_one_parameters_cell(nb: Path):
    cells = json.loads(nb.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{nb.name} must have exactly one cell tagged 'parameters'"
    src = "".join(tagged[0]["source"])
    assert "PROFILE" in src and "SEED" in src, f"{nb.name}: the parameters cell must set PROFILE and SEED"
    for i, cell in enumerate(cells):
        for output in cell.get("outputs", []) or []:
            assert output.get("output_type") != "error", f"{nb.name} cell {i} holds a stored error output"
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                assert "Traceback" not in "".join(output.get("text", "")), f"{nb.name} cell {i}: traceback in stderr"


def test_every_chapter_is_in_the_toc():
    toc = (REPO / "_toc.yml").read_text()
    missing = [nb.stem for nb in CHAPTERS if f"book/{nb.stem}" not in toc]
    assert not missing, f"chapters missing from _toc.yml: {missing}"


def test_a_chapters_execution_and_its_compared_cells_are_one_unit_of_work():
    """`make test` runs on pytest-xdist workers, each taking whole units (conftest.work_unit): a chapter's execution
    and nbval's cells of it go to one worker, in that order, since nbval reads the copy executed there; each replay
    of a committed run is a unit of its own, and so are the replays on another kernel path; any other test goes with
    its module."""
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    unit = module.work_unit
    for nb in CHAPTERS:
        run = unit(f"tests/test_notebooks.py::test_chapter_executes_and_records[{nb.stem}]")
        assert run == unit(f"book/{nb.name}::Cell 0") == unit(f"book/{nb.name}::Cell 12"), nb.stem
    assert unit("book/07_hinting.ipynb::Cell 0") != unit("book/08_dro.ipynb::Cell 0")
    assert unit("tests/test_notebooks.py::test_every_chapter_is_in_the_toc") == "tests/test_notebooks.py"
    replay = "tests/test_replay.py::test_a_committed_run_replays_teacher_forced[{}]"
    assert unit(replay.format("protocol/uniform_s0")) != unit(replay.format("protocol/dapo_s0"))
    kernels = "tests/test_replay.py::test_replays_hold_on_another_kernel_path"  # handed out late, after the export
    assert unit(kernels) == kernels != unit("tests/test_replay.py::test_a_moved_number_is_reported")
    assert unit("tests/test_plan.py::test_plan_bad_input_is_one_line") == unit("tests/test_plan.py::test_x[a-b]")
    # the order the workers get them: SmolLM2's export first; the long units of one test before the short ones
    smollm2 = "tests/test_replay.py::test_a_committed_run_replays_teacher_forced[smollm2_protocol/uniform_s0]"
    queue = [("tests/test_replay.py", 70), ("tests/test_plan.py", 35), ("tests/test_hf_models.py", 10),
             ("tests/test_audit_resume.py", 1), (replay.format("protocol/dapo_s0"), 1), (smollm2, 1), (kernels, 1)]
    assert module.hand_out_order(queue) == ["tests/test_hf_models.py", "tests/test_replay.py", "tests/test_plan.py",
                                            smollm2, kernels, "tests/test_audit_resume.py",
                                            replay.format("protocol/dapo_s0")]
