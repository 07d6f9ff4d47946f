"""Bad inputs to the analysis commands (issue #30): ``rlcurate compare`` and ``rlcurate runs`` check the run
JSONs where they enter (readable, of the suite they are read for, finite accuracies and rollout counts),
``compare``'s options against their meaningful ranges, and ``plan`` its prompt lengths. Each refusal is one
line naming the input; a result that cannot be read is recomputed, not counted as done. Listed in
tests/BAD_INPUTS.md (rows A1-A22)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
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
    (["--rho", "2.79"], "--currency and --rho choose the compute axis of --measure cost or to_target"),
    (["--currency", "cost_dense"], "--currency and --rho choose the compute axis of --measure cost or to_target"),
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


def test_compare_refuses_the_baseline_as_its_own_control_before_reading_runs(runs, tmp_path, capsys):
    """``--control uniform`` (the baseline) passed the unknown-arm check, then compare_arms raised a ValueError
    traceback ("the baseline 'uniform' has no values")."""
    message = ("rlcurate compare: error: --control: 'uniform' is the --baseline; an A/A control is another arm (the "
               "baseline's config with another prompt order, such as uniform_aa)")
    for folder in (runs, tmp_path / "none"):  # refused before the runs are read
        err = _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(folder), "--control", "uniform"])
        assert err.strip() == message, err
    err = _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(runs), "--baseline", "insight",
                                   "--control", "uniform", "--control", "insight"])
    assert "--control: 'insight' is the --baseline" in err


@pytest.mark.parametrize("option", [["--plot", "p.png"], ["--measure", "area"], ["--measure", "final"],
                                    ["--control", "uniform_aa"], ["--baseline", "uniform"],
                                    ["--measure", "cost", "--currency", "cost_dense", "--rho", "2"]],
                         ids=["plot", "measure", "measure-default", "control", "baseline", "cost"])
def test_compare_sweep_refuses_the_options_of_the_paired_comparison(runs, tmp_path, capsys, option):
    """``compare --sweep`` prints the chosen learning rates and silently ignored --plot, --measure, --control and
    --baseline (even at their defaults, given explicitly): now one line naming them, before the runs are read."""
    flags = [o for o in option if o.startswith("--")]
    for folder in (runs, tmp_path / "none"):
        err = _one_line_error(capsys, ["compare", "--suite", str(SUITE), "--runs", str(folder), "--sweep", *option])
        verb = "belongs" if len(flags) == 1 else "belong"
        assert err.strip() == (f"rlcurate compare: error: --sweep prints the learning rate each arm takes from a "
                               f"validation sweep; {', '.join(flags)} {verb} to the paired comparison, which --sweep "
                               f"does not make (drop {'it' if len(flags) == 1 else 'them'}, or --sweep)"), err


def _suite_with_budget_in(tmp_path, max_rollouts):
    """The protocol suite with max_rollouts moved from its overrides to its base config (``None``: nowhere)."""
    import yaml

    suite = yaml.safe_load(SUITE.read_text())
    base = yaml.safe_load((REPO / suite["base"]).read_text())
    del suite["overrides"]["max_rollouts"]
    if max_rollouts is not None:
        base["max_rollouts"] = max_rollouts
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    suite["base"] = str(tmp_path / "base.yaml")
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    return tmp_path / "suite.yaml"


def test_compare_takes_the_default_budget_from_the_baseline_runs_config(runs, tmp_path, capsys, monkeypatch):
    """The default budget was read from the suite's overrides alone: a suite whose base config sets max_rollouts
    was refused with "pass --budget", and with --measure cost --budget-rollouts N the user was told to pass
    --budget, which --budget-rollouts then refused. Now the baseline run's resolved max_rollouts."""
    monkeypatch.chdir(REPO)  # the stored runs name their model relative to the repository
    suite = _suite_with_budget_in(tmp_path, 12800)
    argv = ["compare", "--suite", str(suite), "--runs", str(runs)]
    assert main(argv) == 0
    assert "final at 12,800 rollouts; paired differences to uniform" in capsys.readouterr().out
    assert main(argv + ["--measure", "cost"]) == 0
    assert "what uniform spends in 12,800 generated rollouts" in capsys.readouterr().out
    assert main(argv + ["--measure", "cost", "--budget-rollouts", "5120"]) == 0
    assert "accuracy at rollouts 5,120 (generated rollouts), what uniform spends in 5,120 generated rollouts" in \
        capsys.readouterr().out


def test_compare_without_any_max_rollouts_names_the_flag_that_sets_the_budget(runs, tmp_path, capsys):
    """A suite that sets max_rollouts nowhere: one line saying which flag gives the budget; --measure cost
    --budget-rollouts N needs no other (before: "pass --budget", which --budget-rollouts then refused)."""
    for f in runs.glob("*.json"):  # results that record no config: no staleness check against the changed suite
        f.write_text(json.dumps({**json.loads(f.read_text()), "config": {}}))
    suite = _suite_with_budget_in(tmp_path, None)
    argv = ["compare", "--suite", str(suite), "--runs", str(runs)]
    why = (f"rlcurate compare: error: suite {suite} sets no max_rollouts for the baseline run 'uniform' (neither the "
           f"run, the suite's overrides nor the base config {tmp_path / 'base.yaml'}): pass ")
    assert _one_line_error(capsys, argv).strip() == why + "--budget"
    assert _one_line_error(capsys, argv + ["--measure", "cost"]).strip() == why + "--budget-rollouts N (or --budget)"
    assert main(argv + ["--measure", "cost", "--budget-rollouts", "5120"]) == 0
    assert "what uniform spends in 5,120 generated rollouts" in capsys.readouterr().out
    assert main(argv + ["--budget", "5120"]) == 0
    (tmp_path / "far").mkdir()
    far = _suite_with_budget_in(tmp_path / "far", 99999)  # a default budget no run reaches: no --budget to blame
    err = _one_line_error(capsys, ["compare", "--suite", str(far), "--runs", str(runs)]).strip()
    assert err == ("rlcurate compare: error: the budget 99999, the max_rollouts of run 'uniform': no run of suite "
                   "'protocol' reaches it (the largest reaches 12800 rollouts); pass a smaller --budget"), err
    err = _one_line_error(capsys, ["compare", "--suite", str(far), "--runs", str(runs), "--budget", "99999999"])
    assert "--budget 99999999: no run" in err, err  # as written (it said 1e+08)


def test_compare_names_budget_rollouts_only_when_it_was_passed(runs, capsys):
    """A baseline seed that stops short of the default budget of --measure cost was reported as
    "--budget-rollouts 12800: ..." though the user never passed --budget-rollouts."""
    path = runs / "uniform_s1.json"
    result = json.loads(path.read_text())
    result["metrics"] = [m for m in result["metrics"] if m.get("total/rollouts", 0) <= 10240]
    path.write_text(json.dumps(result))
    argv = ["compare", "--suite", str(SUITE), "--runs", str(runs), "--measure", "cost"]
    err = _one_line_error(capsys, argv).strip()
    assert err == ("rlcurate compare: error: --measure cost reads the budget where the baseline has generated its "
                   "max_rollouts, 12800: the baseline 'uniform' stops short of it in seed(s) 1; pass a smaller "
                   "--budget-rollouts (or --budget)"), err
    err = _one_line_error(capsys, argv + ["--budget-rollouts", "11000"]).strip()
    assert err == ("rlcurate compare: error: --budget-rollouts 11000: the baseline 'uniform' stops short of it in "
                   "seed(s) 1")


def test_compare_reads_the_folder_runs_wrote_under_either_name(runs, capsys):
    """``rlcurate runs --out DIR`` writes the folder that ``compare --runs DIR`` reads; ``compare --out DIR``
    names the same folder, so the flag that wrote it also reads it."""
    assert main(["compare", "--suite", str(SUITE), "--runs", str(runs)]) == 0
    by_runs = capsys.readouterr().out
    assert main(["compare", "--suite", str(SUITE), "--out", str(runs)]) == 0
    assert capsys.readouterr().out == by_runs and "insight" in by_runs


def test_a_ratio_forest_labels_its_log_axis_with_plain_ratios():
    """The forest of ``compare --measure to_target --plot`` reads 0.5, 0.7, 1, 1.5 on its log axis, not 5 x 10^-1 and
    minor labels that overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlcurate.book.paired import forest
    from rlcurate.comparison import ratio_table

    rng = np.random.default_rng(0)
    values = {"uniform": {s: float(v) for s, v in enumerate(rng.uniform(800, 1200, 8))},
              "fast": {s: float(v) for s, v in enumerate(rng.uniform(400, 700, 8))}}
    fig, ax = plt.subplots()
    forest(ax, ratio_table(values, "uniform", budget=2000.0), "t", lambda a: "black", ratio=True)
    fig.canvas.draw()
    major = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    minor = [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(fig)
    assert major and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in major) and "1" in major and not minor, (major, minor)
