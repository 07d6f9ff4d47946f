"""The chapters' GPU cells in a dry run, on this machine (appendix A1, *What has run on a GPU*).

Each chapter with a GPU cell is executed top to bottom in the ``smoke`` profile with ``RLCURATE_DRYRUN=1``
(:mod:`rlcurate.dryrun`): its GPU cells then run exactly as in the ``gpu`` profile, except that every Hub
model is a random-weight checkpoint of its real architecture with two layers (real widths, vocabulary and
tokenizer, loaded with ``from_pretrained``), every trainer runs at most two steps of its config cut to
short completions, with coin rewards, and the rest of the chapter runs at test size. The executed copies
go to a temporary folder; the source notebooks are not touched. Records pass or fail and the wall time of
each chapter, and the lines its GPU cells printed.

    .venv/bin/python bench/bench_dryrun_chapters.py                     # every chapter with a GPU cell
    .venv/bin/python bench/bench_dryrun_chapters.py book/05_grpo_loop.ipynb
    .venv/bin/python bench/bench_dryrun_chapters.py --gpu-cells-only book/05_grpo_loop.ipynb  # set-up and GPU cells
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, write_json  # noqa: E402

GPU_MARK = "gpu_cells(PROFILE)"


def chapters_with_gpu_cells() -> list[Path]:
    """The chapters whose code calls :func:`rlcurate.book.gpu_cells`."""
    return [p for p in sorted((REPO / "book").glob("*.ipynb")) if GPU_MARK in p.read_text()]


def gpu_cell_output(nb: dict) -> list[str]:
    """The text the executed GPU cells printed (stream outputs), stripped of progress bars."""
    lines = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or GPU_MARK not in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                lines += [ln for ln in "".join(out["text"]).splitlines() if ln.strip()]
    return lines


def setup_and_gpu_cells(nb: dict) -> dict:
    """The notebook cut to its set-up (the code cells above the first markdown cell after the title) and its GPU
    cells: what a GPU cell may use, without the chapter's CPU work in between."""
    cells = nb["cells"]
    first_section = next((i for i, c in enumerate(cells) if i > 0 and c["cell_type"] == "markdown"), len(cells))
    keep = [c for i, c in enumerate(cells) if c["cell_type"] == "code"
            and (i < first_section or GPU_MARK in "".join(c["source"]))]
    return {**nb, "cells": keep}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", type=Path, help="default: every chapter with a GPU cell")
    ap.add_argument("--out", default=str(DATA / "dryrun_chapters_cpu.json"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--gpu-cells-only", action="store_true",
                    help="run each chapter's set-up cells and GPU cells only, not the CPU cells between them")
    args = ap.parse_args(argv)
    import subprocess

    chapters = [c.resolve() for c in args.chapters] or chapters_with_gpu_cells()
    env = {**os.environ, "RLCURATE_DRYRUN": "1", "RLCURATE_PROFILE": "smoke"}
    head = header("the chapters' GPU cells in a dry run on this machine (smoke profile, RLCURATE_DRYRUN=1)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in chapters:  # one papermill process per chapter, as the book's build runs them
            out = Path(tmp) / path.name
            source = path
            if args.gpu_cells_only:
                source = Path(tmp) / f"cut_{path.name}"
                source.write_text(json.dumps(setup_and_gpu_cells(json.loads(path.read_text()))))
            t0 = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "papermill", str(source), str(out), "-k", "python3",
                                  "--cwd", str(path.parent), "--execution-timeout", str(args.timeout)],
                                 env=env, capture_output=True, text=True)
            row = {"chapter": path.name, "passed": run.returncode == 0}
            if out.is_file():
                row["gpu_cell_output"] = gpu_cell_output(json.loads(out.read_text()))
            if run.returncode:
                row["error"] = run.stderr[-2000:]
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(f"{path.name}: {'passed' if row['passed'] else 'FAILED'} in {row['seconds']:.0f} s", flush=True)
    write_json({**head, "chapters": rows}, args.out)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
