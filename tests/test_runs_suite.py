"""``rlcurate runs`` (rlcurate.experiments): one (run, seed) of a suite trained in its own process, its
result written, and its resume checkpoint deleted once the result exists."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rlcurate.experiments import load_suite, pending_runs, regenerate_command, result_path, run_one

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
    # made with --out and --scratch of its own, the stored command makes it again in the same places
    assert stored["command"] == (f"rlcurate runs --suite {suite_file} --only uniform --seeds 0 --force --out {out} "
                                 f"--scratch {scratch}")
    assert regenerate_command(suite, "uniform", 0, Path("data/runs/tiny_two_steps"), Path("runs/tiny_two_steps")) \
        == f"rlcurate runs --suite {suite_file} --only uniform --seeds 0 --force"
    assert regenerate_command(suite, "uniform", 0, Path("my runs")).endswith("--force --out 'my runs'")  # quoted


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


def test_model_parameters_are_read_from_the_architecture_alone(tmp_path):
    """What the suite's disk check counts: a checkpoint directory's config.json, a recorded Hub id (Qwen2.5-0.5B's
    published 494,032,768), and None for a Hub id only loading would tell or a config transformers cannot read."""
    from rlcurate.models import load_policy
    from rlcurate.models.architectures import model_parameters

    tiny = REPO / "data" / "tiny" / "spread"
    model, _ = load_policy(str(tiny), device="cpu", dtype="fp32")
    assert model_parameters(tiny) == sum(p.numel() for p in model.parameters())
    assert model_parameters("Qwen/Qwen2.5-0.5B-Instruct") == 494_032_768
    assert model_parameters("someone/unrecorded-model") is None
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}\n')
    assert model_parameters(tmp_path) is None


def test_the_scratch_folder_must_hold_the_checkpoints_of_the_runs_made_at_once(tmp_path, monkeypatch):
    """Runs started together each see the same free space: the suite needs the sum of its `--jobs` largest runs'
    (TrainConfig.out_dir_need with the planner's 12 bytes a parameter); exactly enough is enough; a run that
    resumes adds one checkpoint; with --force the old folders about to be removed count as free."""
    import collections
    import shutil

    import pytest

    from rlcurate.errors import UserError
    from rlcurate.experiments import _check_scratch_space, run_config
    from rlcurate.models.architectures import model_parameters

    suite = load_suite(REPO / "configs" / "suites" / "protocol.yaml")
    scratch = tmp_path / "scratch"
    runs = [(n, s, run_config(suite, n, s, scratch)) for s in (0, 1) for n in ("uniform", "dapo")]
    checkpoint = 12 * model_parameters(runs[0][2].model)
    need = 2 * checkpoint  # checkpoint_every 50 < the run's steps: two while one replaces the other
    usage = collections.namedtuple("usage", "total used free")
    free = {"bytes": 3 * need - 1}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, free["bytes"]))
    with pytest.raises(UserError, match=rf"^--scratch {scratch}: .* GiB free there, but 3 runs at a time \(--jobs 3\) "
                                        r"need .* GiB for checkpoints \(run 'uniform' seed 0's: .* GiB each, two while "
                                        r"one replaces the other\); free some space, lower --jobs or choose another"):
        _check_scratch_space(runs, scratch, force=False, jobs=3)
    _check_scratch_space(runs, scratch, force=False, jobs=2)
    free["bytes"] = 3 * need
    _check_scratch_space(runs, scratch, force=False, jobs=3)
    with pytest.raises(UserError, match=r"4 runs at a time \(--jobs 8\)"):  # the suite's four runs, not eight
        _check_scratch_space(runs, scratch, force=False, jobs=8)
    free["bytes"] = 4 * need
    _check_scratch_space(runs, scratch, force=False, jobs=8)
    # one run resumes from its checkpoint: it adds one checkpoint, not two
    old = Path(runs[0][2].out_dir) / "checkpoint"
    old.mkdir(parents=True)
    (old / "state.pt").write_bytes(b"x" * 1000)
    free["bytes"] = 3 * need + checkpoint
    _check_scratch_space(runs, scratch, force=False, jobs=4)
    free["bytes"] = 3 * need + checkpoint - 1
    with pytest.raises(UserError):
        _check_scratch_space(runs, scratch, force=False, jobs=4)
    # with --force that folder is removed first: it starts over (two checkpoints), and its 1000 bytes are free
    free["bytes"] = 4 * need - 1000
    _check_scratch_space(runs, scratch, force=True, jobs=4)
    free["bytes"] -= 1
    with pytest.raises(UserError):
        _check_scratch_space(runs, scratch, force=True, jobs=4)


def _copy_suite(tmp_path, name="grpo_loop", **runs_change):
    """configs/suites/NAME.yaml and its committed results, copied (a suite whose results exist), with the runs'
    configs changed by ``runs_change``."""
    import shutil

    suite = yaml.safe_load((REPO / "configs" / "suites" / f"{name}.yaml").read_text())
    suite["base"] = str(REPO / "configs" / "tiny_uniform.yaml")
    for run, change in runs_change.items():
        suite["runs"][run] = {**suite["runs"][run], **change}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = tmp_path / "out"
    shutil.copytree(REPO / "data" / "runs" / name, out, dirs_exist_ok=True)
    return path, out


def test_a_stored_result_made_with_another_config_is_listed_stale_and_refused(tmp_path, capsys, monkeypatch):
    """Results are kept across edits of the suite file, so one made with another config would be paired with
    runs of the new one: --list says it is stale and what changed, `runs` (without --force) and `compare` refuse
    in one line before any work; the suite's model is found beside its base config from any folder."""
    from rlcurate.cli import main

    monkeypatch.chdir(tmp_path)  # not the repository: data/tiny/spread is found beside the base config
    path, out = _copy_suite(tmp_path, "protocol_aa")
    base = ["--suite", str(path), "--out", str(out), "--scratch", str(tmp_path / "scratch")]
    assert main(["runs", *base, "--list"]) == 0
    assert capsys.readouterr().out.count(": done") == 16
    assert main(["compare", "--suite", str(path), "--runs", str(out)]) == 0
    capsys.readouterr()
    path, out = _copy_suite(tmp_path, "protocol_aa", uniform_aa={"lr": 0.5})
    assert main(["runs", *base, "--list"]) == 0
    listed = capsys.readouterr().out
    assert listed.count("stale, made with another config (lr: 0.0001 -> 0.5)") == 8 and listed.count(": done") == 8
    for argv in (["runs", *base], ["compare", "--suite", str(path), "--runs", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "8 stored result(s) of suite 'protocol_aa' were made with " \
            "another config" in err and "run 'uniform_aa' seed 8: lr: 0.0001 -> 0.5" in err and "--force" in err, err
    assert not (tmp_path / "scratch").exists()
    # an arm of the suite without any result is named, not left out silently: here no arm is left to compare
    path, out = _copy_suite(tmp_path, "protocol_aa")
    for f in out.glob("uniform_aa_s*.json"):
        f.unlink()
    assert main(["compare", "--suite", str(path), "--runs", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--baseline 'uniform': no arm has all of its 8 seeds (8-15), which " \
        "pairing needs; seeds finished of those: uniform_aa 0 (a suite still running: rlcurate runs --suite" in err, err


def test_a_suite_may_not_set_what_runs_sets_and_a_bad_run_config_is_refused_by_list(tmp_path, capsys):
    from rlcurate.cli import main

    for change, needle in (({"seed": 5}, "run 'g16' sets seed: 5, which `rlcurate runs` sets itself; a suite's seeds "
                                         "are its seeds: list"),
                           ({"out_dir": "x"}, "choose the folder with --scratch"), ({"lrr": 1}, "lrr")):
        path, _ = _copy_suite(tmp_path, g16=change)
        assert main(["runs", "--suite", str(path), "--out", str(tmp_path / "o"), "--list"]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err


def test_force_starts_a_run_over_but_resumes_one_it_stopped_with_the_same_config(tmp_path):
    """A forced run stopped part-way leaves a checkpoint of the same config: the same command (--force) resumes
    it; a checkpoint of another config, or a finished run's folder, is emptied."""
    import dataclasses
    import json

    from rlcurate.experiments import _start_over, run_config

    suite = load_suite(REPO / "configs" / "suites" / "grpo_loop.yaml")
    configs = [(n, 0, run_config(suite, n, 0, tmp_path)) for n in ("g4", "g16")]
    for (_, _, config), saved in zip(configs, (configs[0][2], dataclasses.replace(configs[1][2], lr=0.5))):
        ckpt = Path(config.out_dir) / "checkpoint"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer.json").write_text(json.dumps({"step": 3, "config": saved.to_dict()}))
        (ckpt / "state.pt").write_bytes(b"x")
    finished = run_config(suite, "g4", 1, tmp_path)
    Path(finished.out_dir).mkdir()
    (Path(finished.out_dir) / "metrics.jsonl").write_text("{}\n")
    _start_over(configs + [("g4", 1, finished)])
    assert (Path(configs[0][2].out_dir) / "checkpoint").exists()  # the same config: resumed
    assert not Path(configs[1][2].out_dir).exists() and not Path(finished.out_dir).exists()
