"""Bad inputs to the analysis commands (issue #30): ``rlcurate compare`` and ``rlcurate runs`` check the run
JSONs where they enter (readable, of the suite they are read for, finite accuracies and rollout counts),
``compare``'s options against their meaningful ranges, and ``plan`` its prompt lengths. Each refusal is one
line naming the input; a result that cannot be read is recomputed, not counted as done. Listed in
tests/BAD_INPUTS.md (rows A1-A9)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlcurate.cli import main
from rlcurate.experiments import pending_runs, result_path

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "configs" / "suites" / "protocol.yaml"


@pytest.fixture()
def runs(tmp_path):
    """A copy of the protocol suite's first two seeds of uniform and INSIGHT (enough for a paired table)."""
    out = tmp_path / "protocol"
    out.mkdir()
    for arm in ("uniform", "insight"):
        for seed in (0, 1, 2):
            shutil.copy(REPO / "data" / "runs" / "protocol" / f"{arm}_s{seed}.json", out)
    return out


def _one_line_error(capsys, argv, *needles):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_a_nan_accuracy_is_refused_naming_the_file_and_the_record(runs, capsys):
    path = runs / "insight_s1.json"
    result = json.loads(path.read_text())
    evals = [i for i, m in enumerate(result["metrics"]) if "eval/accuracy" in m]
    result["metrics"][evals[-1]]["eval/accuracy"] = float("nan")
    path.write_text(json.dumps(result))  # json writes NaN, as a careless script would
    assert main(["compare", "--suite", str(SUITE), "--runs", str(runs)]) != 0
    err = capsys.readouterr().err
    assert "insight_s1.json" in err and f"metrics record {evals[-1]}" in err and "eval/accuracy = nan" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_truncated_result_is_named_listed_as_unreadable_and_recomputed(runs, capsys):
    path = runs / "uniform_s2.json"
    path.write_text(path.read_text()[:200])
    _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(runs)], "uniform_s2.json",
                    "not a readable result")
    assert main(["runs", "--suite", str(SUITE), "--out", str(runs), "--only", "uniform", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "seed 2: unreadable (will be recomputed)" in listed and "seed 0: done" in listed
    assert pending_runs(["uniform"], [0, 1, 2], runs) == [("uniform", 2)]


def test_another_suites_runs_are_refused(capsys, tmp_path):
    out = tmp_path / "mixed"
    out.mkdir()
    shutil.copy(REPO / "data" / "runs" / "protocol_aa" / "uniform_aa_s10.json", out)
    _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(out)], "uniform_aa_s10.json",
                    "a run of suite 'protocol_aa', not of 'protocol'")


@pytest.mark.parametrize("option, message", [
    (["--budget", "-100"], "--budget must be a finite number > 0, got -100"),
    (["--budget", "1e12"], "no run of suite 'protocol' reaches it"),
    (["--budget", "nan"], "--budget must be a finite number > 0"),
    (["--rho", "-5"], "--rho must be a finite number >= 0"),
    (["--control", "uniform_typo"], "--control: no arm 'uniform_typo' in the runs"),
    (["--measure", "cost", "--budget-rollouts", "-3"], "--budget-rollouts must be a finite number > 0, got -3"),
    (["--budget-rollouts", "100"], "--budget-rollouts sets the budget of --measure cost"),
    (["--measure", "cost", "--budget-rollouts", "1e9"], "the baseline 'uniform' stops short of it in seed(s)"),
    (["--rho", "2.79"], "--currency and --rho choose the compute axis of --measure cost"),
    (["--currency", "cost_dense"], "--currency and --rho choose the compute axis of --measure cost"),
    (["--measure", "cost", "--currency", "tokens", "--rho", "2"], "--rho prices trained rollouts in cost_sparse and"),
])
def test_compare_options_out_of_range_are_one_line(runs, capsys, option, message):
    _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(runs), *option], message)


def test_plan_refuses_prompt_lengths_that_are_not_lengths(capsys):
    config = REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml"
    for lengths in (["-5", "-5", "-5"], ["100", "50", "200"]):
        _one_line_error(capsys, ["plan", "--config", str(config), "--prompt-tokens", *lengths],
                        "--prompt-tokens MIN MEAN MAX must be whole numbers with 1 <= MIN <= MEAN <= MAX")


def test_compare_plot_draws_the_forest_and_the_curves(runs, tmp_path, capsys):
    """``compare --plot FILE`` (issue #33): the paired table's forest and each arm's mean curve, written
    after the table; a file it cannot write is refused before any run is read."""
    out = tmp_path / "protocol.png"
    assert main(["compare", "--suite", str(SUITE), "--runs", str(runs), "--plot", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    from PIL import Image

    with Image.open(out) as image:
        assert image.size[0] > 1000 and len(image.convert("RGB").getcolors(1 << 24)) > 50  # a drawing, not a blank
    _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(runs), "--plot", str(tmp_path / "x.txt")],
                    "--plot", "give a file ending in .png, .pdf, .svg")
    _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(tmp_path / "none"), "--plot",
                             str(tmp_path / "missing" / "p.png")], "folder", "does not exist")


def test_compare_says_what_a_failing_a_a_control_means(capsys):
    """Issue #30: the committed table showed uniform_aa at p 0.021 with nothing saying what a failing control
    means for the other rows."""
    assert main(["compare", "--suite", str(SUITE)]) == 0
    out = capsys.readouterr().out
    assert "warning: the interval of the A/A control uniform_aa excludes zero" in out and "is not evidence" in out
