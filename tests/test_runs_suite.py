"""``rlcurate runs`` (rlcurate.experiments): one (run, seed) of a suite trained in its own process, its
result written, and its resume checkpoint deleted once the result exists."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rlcurate.experiments import load_suite, pending_runs, result_path, run_one

REPO = Path(__file__).resolve().parents[1]


def test_a_finished_run_writes_its_result_and_drops_its_checkpoint(tmp_path):
    suite_file = tmp_path / "tiny_two_steps.yaml"
    suite_file.write_text(yaml.safe_dump({
        "name": "tiny_two_steps", "base": "configs/tiny_uniform.yaml",
        "overrides": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "eval_every": 0,
                      "checkpoint_every": 1, "threads": 1},
        "seeds": [0], "runs": {"uniform": {}}}))
    suite = load_suite(suite_file)
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    scratch.mkdir()
    out.mkdir()
    result = run_one(suite, "uniform", 0, out, scratch)
    stored = json.loads(result_path(out, "uniform", 0).read_text())
    assert stored["run"] == "uniform" and stored["summary"]["steps"] == 2 == result["summary"]["steps"]
    run_dir = Path(result["config"]["out_dir"])
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "summary.json").is_file()
    assert not (run_dir / "checkpoint").exists() and not (run_dir / "checkpoint.old").exists()


def test_pending_runs_go_seed_by_seed_and_skip_finished_ones(tmp_path):
    result_path(tmp_path, "a", 0).write_text(json.dumps({"suite": "s", "run": "a", "seed": 0, "config": {},
                                                         "metrics": [{"eval/accuracy": 0.5, "total/rollouts": 8}]}))
    assert pending_runs(["a", "b"], [0, 1], tmp_path) == [("b", 0), ("a", 1), ("b", 1)]
    assert pending_runs(["a", "b"], [0, 1], tmp_path, force=True) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_suite_progress_says_what_changed_with_counts_and_an_eta(tmp_path):
    """`rlcurate runs`' progress (issue #33): a line when a run starts, ends or fails, a line for a running
    run only when its step or held-out accuracy changed, the suite's counts and an ETA from the finished
    runs' mean wall time on every line, and the same lines in the log file."""
    from rlcurate.runs_progress import SuiteProgress

    lines, log = [], tmp_path / "progress.log"
    p = SuiteProgress(total=4, jobs=2, log=log, write=lines.append)
    run_dir = tmp_path / "a_s0"
    run_dir.mkdir()
    p.started("a", 0, run_dir)
    p.started("b", 0, tmp_path / "b_s0")  # not written yet: no line from poll
    assert lines[-1] == "[done 0/4, running 2, failed 0, left 2] started b seed 0"
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.25}\n{"step": 1}\n{"step": 2, "loss"')
    p.poll()
    assert lines[-1].endswith("a seed 0 at step 1, held-out accuracy 0.250")
    n = len(lines)
    p.poll()  # nothing changed: nothing said
    assert len(lines) == n
    p.finished("a", 0, 100.0, 0.5)
    assert lines[-1] == "[done 1/4, running 1, failed 0, left 2, ETA 2m05s] done a seed 0 in 100 s, final accuracy 0.5"
    p.failed_run("b", 0, "exit 1")
    assert lines[-1].startswith("[done 1/4, running 0, failed 1, left 2, ETA 1m40s] FAILED b seed 0")
    assert log.read_text().splitlines() == lines
