"""Bad inputs to the other commands (runs, advise, warmstart, conditions) and to a run's data and checkpoint, found
by an audit of the command line: each is refused in one line before the work it would spoil, and what was already
computed stays."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from rlcurate.cli import main
from rlcurate.errors import UserError

REPO = Path(__file__).resolve().parents[1]
SPREAD = REPO / "data" / "tiny" / "spread"
TINY_CFG = REPO / "configs" / "tiny_uniform.yaml"
SMALL = ["steps=1", "prompts_per_step=2", "group_size=2", "max_new_tokens=8", "eval_every=0", "checkpoint_every=1",
         "task_kwargs.n_train=16", "task_kwargs.n_test=4"]  # a one-step run with a checkpoint, in seconds


def _refused(capsys, argv, *needles) -> str:
    """Run the CLI in-process; it must exit 2 with one non-empty stderr line naming ``needles``."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _train(out: Path, *sets: str) -> list[str]:
    argv = ["train", "--config", str(TINY_CFG), "--set", f"out_dir={out}", "--set", "threads=1",
            "--set", "progress=false", "--set", "save_model=false"]
    for s in sets:
        argv += ["--set", s]
    return argv


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("setting", ["device=cuda", "dtype=bf16"])
def test_cuda_settings_on_a_machine_without_cuda_are_refused_before_the_run_folder_is_made(capsys, tmp_path, setting):
    _refused(capsys, _train(tmp_path / "run", setting), setting, "CUDA is not available")
    assert not (tmp_path / "run").exists()


def test_bf16_on_the_cpu_is_refused_on_any_machine_before_the_run_folder_is_made(capsys, tmp_path):
    """Before: on a machine with CUDA, device=cpu with dtype=bf16 passed the checks and was refused by the trainer
    after the run folder was made."""
    _refused(capsys, _train(tmp_path / "run", "device=cpu", "dtype=bf16"), "dtype=bf16")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_setting_on_a_folder_with_a_checkpoint_names_the_machine_first(capsys, tmp_path):
    """Before: the resume check spoke first ("a checkpoint made with a different config: dtype"), and its remedy
    (resume=false) led to the CUDA refusal."""
    assert main(_train(tmp_path / "run", "steps=1", "checkpoint_every=1", "eval_every=0")) == 0
    capsys.readouterr()
    _refused(capsys, _train(tmp_path / "run", "steps=2", "checkpoint_every=1", "eval_every=0", "dtype=bf16"),
             "dtype=bf16 but CUDA is not available")


def test_an_empty_evaluation_split_is_refused_before_the_model_loads(capsys, tmp_path):
    _refused(capsys, _train(tmp_path / "run", "task_kwargs.n_test=0", "eval_every=1"),
             "has no test problems to evaluate on")
    assert not (tmp_path / "run").exists()


def test_a_damaged_model_state_in_the_checkpoint_is_refused_and_the_checkpoint_kept(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(_train(out, *SMALL)) == 0
    capsys.readouterr()
    state = out / "checkpoint" / "state.pt"
    state.write_bytes(b"")
    _refused(capsys, _train(out, *SMALL[1:], "steps=2"), "state.pt is missing or empty", "damaged")
    assert state.exists() and (out / "checkpoint" / "trainer.json").exists()


def test_runs_refuses_replay_zero_and_repeated_runs_seeds_or_jobs_below_one(capsys, tmp_path):
    suite = str(REPO / "configs" / "suites" / "protocol.yaml")
    base = ["runs", "--suite", suite, "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")]
    _refused(capsys, base + ["--replay", "0"], "--replay must be a positive number of steps, got 0")
    _refused(capsys, base + ["--seeds", "0,0"], "--seeds must name each seed once")
    _refused(capsys, base + ["--only", "uniform,uniform"], "--only must name each run once")
    _refused(capsys, base + ["--only", "uniform,"], "--only must name each run once")
    _refused(capsys, base + ["--jobs", "0"], "--jobs must be a positive number")
    assert not (tmp_path / "out").exists() and not (tmp_path / "scratch").exists()


def test_runs_refuses_more_runs_at_a_time_than_the_scratch_disk_holds(capsys, tmp_path, monkeypatch):
    """Each run checks its own room when it starts, but --jobs runs started together all see the same free
    space: the suite is refused before any run when their checkpoints together cannot fit."""
    import collections
    import shutil

    suite = str(REPO / "configs" / "suites" / "protocol.yaml")
    argv = ["runs", "--suite", suite, "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch"),
            "--only", "uniform,dapo", "--seeds", "0", "--jobs", "2"]
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**40, 0, 2**20))
    _refused(capsys, argv, f"--scratch {tmp_path / 'scratch'}: 0.00 GiB free there, but 2 runs at a time (--jobs 2) need",
             "lower --jobs")
    assert not (tmp_path / "out").exists() and not (tmp_path / "scratch").exists()


def test_advise_refuses_an_out_that_is_a_file_before_it_simulates(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    _refused(capsys, ["advise", str(REPO / "data" / "audits" / "smollm2_arith_chat_train"), "--out", str(afile)],
             "--out", "is a file")
    assert afile.read_text() == "keep me\n"


def test_warmstart_refuses_an_out_holding_a_checkpoint_or_a_file_and_bad_model_options(tmp_path, capsys):
    held = tmp_path / "held"
    held.mkdir()
    (held / "config.json").write_text("{}\n")
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    few = ["warmstart", "--steps", "1", "--batch-size", "2", "--eval-every", "0", "--no-hint-eval", "--no-progress"]
    for argv, needle in ((few + ["--out", str(held)], "already holds a checkpoint; pass --force"),
                         (few + ["--out", str(afile / "sub")], "is a file"),
                         (few + ["--out", str(tmp_path / "w"), "--betas", "0.9"], "betas must be two numbers"),
                         (few + ["--out", str(tmp_path / "w"), "--layers", "0"], "--layers must be a positive integer")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and needle in err and "Traceback" not in err, err
    assert (held / "config.json").read_text() == "{}\n" and not (tmp_path / "w").exists()


def test_a_condition_or_arm_with_a_group_size_below_one_is_refused(tmp_path):
    from rlcurate.conditions import condition_config, load_conditions

    suite = load_conditions(REPO / "configs" / "suites" / "conditions_sim.yaml")
    bad = copy.deepcopy(suite)
    name = next(iter(bad["conditions"]))
    bad["conditions"][name] = {**(bad["conditions"][name] or {}), "group_size": -4}
    with pytest.raises(UserError, match="group_size -4 and rollouts_per_step .* must be positive"):
        condition_config(bad, name)


def test_a_folder_whose_config_is_not_a_models_is_refused_naming_the_run_model(capsys, tmp_path):
    run = tmp_path / "a_run"
    (run / "final").mkdir(parents=True)
    (run / "config.json").write_text('{"strategy": "uniform", "lr": 1e-5}\n')
    (run / "final" / "config.json").write_text('{"model_type": "qwen2"}\n')
    _refused(capsys, _train(tmp_path / "run", f"model={run}"), "has no model_type", f"{run / 'final'}")


def test_a_finished_runs_results_are_not_overwritten_by_a_run_with_another_config(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(_train(out, *SMALL)) == 0
    capsys.readouterr()
    import shutil

    shutil.rmtree(out / "checkpoint")  # as `rlcurate runs` leaves a finished run's scratch folder
    kept = (out / "metrics.jsonl").read_text()
    _refused(capsys, _train(out, *SMALL, "lr=0.5"), "holds the results of a run with a different config", "lr:")
    assert (out / "metrics.jsonl").read_text() == kept
    assert main(_train(out, *SMALL, "lr=0.5", "resume=false")) == 0  # said explicitly: overwritten


@pytest.mark.parametrize("flags, needle", [(["--layers", "0"], "--layers must be a positive number"),
                                           (["--device", "gpu"], "--device must be auto, cpu or cuda"),
                                           (["--json", "/nonexistent_folder/dry.json"], "does not exist"),
                                           (["--steps", "0"], "--steps must be at least 1, got 0"),
                                           (["--layers", "1000"], "--layers 1000: Qwen/Qwen2.5-0.5B-Instruct has 24 "
                                                                  "layers; keep at most 24")])
def test_dryrun_refuses_bad_options_before_it_builds_a_checkpoint(capsys, monkeypatch, flags, needle):
    monkeypatch.setenv("RLCURATE_DATA_DIR", str(REPO.parent / "shared" / "data"))  # the tokenizer is found
    _refused(capsys, ["dryrun", "--config", str(REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml"), *flags], needle)


@pytest.mark.parametrize("setting, needle", [("strategy=dapoo", "did you mean 'dapo'"),
                                             ("task=gsm8", "did you mean 'gsm8k'")])
def test_plan_refuses_a_misspelt_strategy_or_task_instead_of_planning_it(capsys, setting, needle):
    _refused(capsys, ["plan", "--config", str(REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml"), "--set", setting],
             "gpu_grpo_qwen25_05b_gsm8k.yaml", needle)
