"""Chapter 11's endpoint and conditions map: rollouts to a target, paired ratios with their bounds, and the
conditions suite in the simulated world (its file checked before any run, a small suite end to end)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from rlcurate.comparison import ratio_table, rollouts_to_target
from rlcurate.errors import UserError


def test_rollouts_to_target_interpolates_and_says_never():
    x, y = [0, 100, 200, 300], [0.2, 0.3, 0.5, 0.6]
    assert rollouts_to_target(x, y, 0.4) == 150.0
    assert rollouts_to_target(x, y, 0.2) == 0.0
    assert rollouts_to_target(x, y, 0.7) == math.inf


def test_ratio_table_recovers_a_known_ratio_with_an_interval_that_covers_it():
    rng = np.random.default_rng(0)
    covered, n_rep = 0, 400
    for _ in range(n_rep):
        base = np.exp(rng.normal(8, 0.3, 8))  # a seed effect the arms share (common random numbers)
        values = {"uniform": dict(enumerate(base)),
                  "fast": dict(enumerate(base * 0.7 * np.exp(rng.normal(0, 0.1, 8))))}
        r = ratio_table(values)["fast"]
        covered += r.low <= 0.7 <= r.high
    assert 0.92 <= covered / n_rep <= 0.98  # the nominal 95 % holds for log-normal ratios


def test_ratio_table_bounds_censoring_holm_and_the_published_gain():
    base = {s: 1000.0 + 50 * s for s in range(8)}
    values = {"uniform": base, "same": {s: v * (1.0 + 0.01 * (-1) ** s) for s, v in base.items()},
              "slow": {s: 2 * v for s, v in base.items()}, "uniform_aa": {s: v * 1.02 ** (-1) ** s for s, v in base.items()},
              "miss": {s: (math.inf if s < 2 else 0.8 * v) for s, v in base.items()}}
    t = ratio_table(values, budget=3000.0, published={"same": 0.5, "slow": 2.0})
    assert set(t) == {"same", "slow", "miss", "uniform_aa"}
    same, slow, miss = t["same"], t["slow"], t["miss"]
    assert same.covers_one and 0 < same.saving_bound < 0.05  # saves at most a few per cent
    assert 0 < same.extra_cost_bound < 0.05  # and costs at most a few per cent more
    # the one-sided bounds sit inside the two-sided interval, symmetric about the ratio on the log scale
    assert same.low < 1 - same.saving_bound < same.ratio < 1 + same.extra_cost_bound < same.high
    assert math.log(1 + same.extra_cost_bound) - math.log(same.ratio) == pytest.approx(
        math.log(same.ratio) - math.log(1 - same.saving_bound))
    assert slow.ratio == pytest.approx(2.0) and slow.saving_bound == pytest.approx(-1.0)
    assert slow.extra_cost_bound == pytest.approx(1.0)
    assert slow.saving_text == "none" and same.saving_text == f"{same.saving_bound:.0%}" != "0%"  # never "-100%"
    assert same.p_published < 0.001  # "twice as fast" is excluded
    assert miss.censored == 2  # never reached: counted at the budget
    assert t["uniform_aa"].p_holm == t["uniform_aa"].p_t  # the control is outside the Holm family
    with pytest.raises(ValueError, match="budget"):
        ratio_table({"uniform": base, "miss": values["miss"]})


SMALL = {
    "name": "conditions_test",
    "world": {"n_prompts": 120, "n_skills": 8, "noise_dims": 4},
    "train": {"rollouts_per_step": 32, "group_size": 8, "optimizer": "adam", "validation_fraction": 0.1,
              "test_fraction": 0.2},
    "budget": 640, "lrs": [0.3, 1.0], "validation_seeds": [100], "seeds": [0, 1, 2],
    "endpoint": {"primary": "rollouts_to_target", "close_gap": 0.3},
    "arms": {"uniform": {}, "uniform_aa": {"order_offset": 1000, "lr_of": "uniform"},
             "oracle_select": {"strategy": "oracle_select"}},
    "conditions": {"main": {}, "g4": {"group_size": 4}, "hard": {"pass_rate_beta": [0.3, 2.5]}},
}


def test_an_out_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path, capsys):
    from rlcurate.cli import main

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    for out, needle in (("/proc/x", "--out: out_dir='/proc/x' cannot be written"),
                        (str(path), "is a file, not a directory")):
        assert main(["conditions", "--suite", str(path), "--out", out]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_small_conditions_suite_runs_end_to_end(tmp_path, capsys):
    from rlcurate.cli import main
    from rlcurate.conditions import condition_config, condition_table, load_conditions

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    suite = load_conditions(path)
    assert condition_config(suite, "g4")["train"]["prompts_per_step"] == 8  # equal rollouts per step
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out"), "--only", "main", "g4"]) == 0
    result = json.loads((tmp_path / "out" / "g4.json").read_text())
    assert result["lr"]["uniform_aa"] == result["lr"]["uniform"] and set(result["sweep"]) == {"uniform", "oracle_select"}
    runs = result["runs"]
    assert set(runs) == set(SMALL["arms"]) and all(len(v) == 3 for v in runs.values())
    first = runs["uniform"]["0"]
    assert first["target"] == pytest.approx(first["start"] + 0.3 * (1 - first["start"]))
    table = condition_table(result)
    assert set(table) == {"oracle_select", "uniform_aa"} and all(r.n == 3 for r in table.values())
    assert not (tmp_path / "out" / "hard.json").exists()
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out"), "--only", "g4"]) == 0
    assert "done" in capsys.readouterr().out  # a finished condition is not recomputed

    # an arm added later runs alone; the others are kept as they were, the set-up must not have changed
    grown = {**SMALL, "arms": {**SMALL["arms"], "uniform_g16": {"group_size": 16}}}
    path.write_text(yaml.safe_dump(grown))
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out"), "--only", "g4"]) == 0
    assert "1 arm(s) run, 3 kept" in capsys.readouterr().out
    again = json.loads((tmp_path / "out" / "g4.json").read_text())
    assert {a: again["runs"][a] for a in runs} == runs and set(again["runs"]) == set(grown["arms"])
    assert again["runs"]["uniform_g16"]["0"]["steps"] == 640 // 32  # its own group size, equal rollouts per step
    path.write_text(yaml.safe_dump({**grown, "budget": 960, "arms": {**grown["arms"], "x": {}}}))
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out"), "--only", "g4"]) == 2
    assert "differs from this result in setup" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"arms": {"insight": {}}}, "uniform"),
    ({"endpoint": {"close_gap": 1.5}}, "close_gap"),
    ({"conditions": {"main": {"pool": 3}}}, "unknown key"),
    ({"extra": 1}, "unknown key"),
    ({"seeds": []}, "seeds"),
    ({"arms": {"uniform": {}, "a": {"strategy_kwarg": {}}}}, "unknown key"),
    ({"arms": {"uniform": {}, "a": {"lr_of": "nope"}}}, "lr_of"),
    # values, each refused before any sweep (an arm's strategy used to fail after the other arms' sweeps)
    ({"budget": "640"}, "budget must be an integer"),
    ({"lrs": [0.3, -1]}, "must be > 0"),
    ({"seeds": [0, 0.5]}, "a seed must be an integer"),
    ({"seeds": [100, 1]}, "share [100]"),
    ({"world": {**SMALL["world"], "n_skils": 3}}, "n_skils"),
    ({"train": {**SMALL["train"], "optimiser": "sgd"}}, "optimiser"),
    ({"train": {**SMALL["train"], "optimizer": "sgdd"}}, "optimizer must be"),
    ({"endpoint": {"primary": "final", "close_gap": 0.3}}, "endpoint must be"),
    ({"conditions": {"main": {"pass_rate_beta": [1]}}}, "two numbers"),
    ({"conditions": {"main": {"budget": "x"}}}, "condition 'main': budget"),
    ({"conditions": {"main": {"n_prompts": 2}}}, "has no prompts"),
    ({"arms": {**SMALL["arms"], "b": {"strategy": "oracle_select", "advantage": "grpoo"}}}, "arm 'b': advantage"),
    ({"arms": {**SMALL["arms"], "b": {"strategy": "insigth"}}}, "did you mean 'insight'"),
    ({"arms": {**SMALL["arms"], "b": {"strategy": "insight", "strategy_kwargs": {"foo": 1}}}}, "does not take foo"),
    ({"arms": {**SMALL["arms"], "b": {"order_offset": "a"}}}, "order_offset must be an integer"),
])
def test_a_bad_conditions_suite_is_one_line(tmp_path, change, message, capsys):
    from rlcurate.cli import main

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **change}))
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(path) in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # refused before the results' folder is made


def test_an_unknown_condition_is_refused_before_any_run(tmp_path, capsys):
    from rlcurate.cli import main

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    assert main(["conditions", "--suite", str(path), "--out", str(tmp_path / "out"), "--only", "nope"]) == 2
    assert "unknown condition" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_runs_suite_declares_its_endpoint_and_the_runs_are_read_by_it(tmp_path):
    from rlcurate.comparison import target_of, to_target_values
    from rlcurate.experiments import load_suite

    path = tmp_path / "s.yaml"
    base = {"name": "s", "base": "configs/tiny_uniform.yaml", "runs": {"a": {}}}
    path.write_text(yaml.safe_dump({**base, "endpoint": {"primary": "rollouts_to_target", "close_gap": 0.4}}))
    assert load_suite(path)["endpoint"]["close_gap"] == 0.4
    for bad, msg in [({"primary": "speed"}, "primary"), ({"primary": "rollouts_to_target"}, "exactly one"),
                     ({"primary": "final", "target": 2}, "target"), ({"primary": "final", "when": 1}, "unknown")]:
        path.write_text(yaml.safe_dump({**base, "endpoint": bad}))
        with pytest.raises(UserError, match=msg):
            load_suite(path)
    assert target_of(0.4, {"close_gap": 0.5}) == pytest.approx(0.7) and target_of(0.4, {"target": 0.6}) == 0.6

    def run(seed, values, spent):
        return {"run": "a", "seed": seed, "metrics": [{"eval/grid": g, "total/rollouts": r, "eval/accuracy": v}
                                                      for g, r, v in zip([0, 100, 200], spent, values)]}

    out = to_target_values([run(0, [0.5, 0.6, 0.8], [0, 110, 210]), run(1, [0.5, 0.55, 0.6], [0, 100, 200])],
                           {"primary": "rollouts_to_target", "close_gap": 0.4})
    assert out["a"][0] == pytest.approx(110 + 100 * (0.7 - 0.6) / 0.2) and out["a"][1] == math.inf


def test_a_condition_may_shrink_the_pool(tmp_path):
    from rlcurate.conditions import condition_config, load_conditions

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "conditions": {"small": {"n_prompts": 60, "budget": 1280}}}))
    setup = condition_config(load_conditions(path), "small")
    assert setup["world"]["n_prompts"] == 60 and setup["budget"] == 1280 and setup["world"]["n_skills"] == 8


def test_rlcurate_compare_reads_rollouts_to_the_declared_target(tmp_path, capsys):
    """``rlcurate compare --measure to_target``: the suite's endpoint, paired ratios, a run that never reaches
    the target counted at the budget; a suite without the endpoint is refused in one line."""
    from rlcurate.cli import main

    suite = {"name": "t", "base": "configs/tiny_uniform.yaml", "overrides": {"max_rollouts": 400},
             "endpoint": {"primary": "rollouts_to_target", "close_gap": 0.5},
             "runs": {"uniform": {}, "uniform_aa": {}, "fast": {}}, "seeds": [0, 1, 2]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(suite))
    runs = tmp_path / "runs"
    runs.mkdir()
    crossing = {"uniform": [200, 220, 180], "uniform_aa": [210, 200, 190], "fast": [100, 120, None]}
    for arm, xs in crossing.items():
        for seed, x in enumerate(xs):
            # accuracy 0.5 at 0, reaching the target 0.75 exactly at x (never when x is None)
            ys = [0.5, 0.6, 0.7] if x is None else [0.5, 0.75, 0.8]
            grid = [0, 200, 400] if x is None else [0, x, 400]
            (runs / f"{arm}_s{seed}.json").write_text(json.dumps({"suite": "t", "run": arm, "seed": seed, "config": {},
                                                                  "metrics": [
                {"eval/grid": g, "total/rollouts": g, "eval/accuracy": y} for g, y in zip(grid, ys)]}))
    assert main(["compare", "--suite", str(tmp_path / "s.yaml"), "--runs", str(runs), "--measure", "to_target"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("fast"))
    expected = math.exp(np.mean(np.log([100 / 200, 120 / 220, 400 / 180])))
    assert f"{expected:.2f}" in row and row.split()[-1] == "1"  # one censored seed, counted at 400
    assert "(control)" in next(line for line in out.splitlines() if line.startswith("uniform_aa"))
    suite.pop("endpoint")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(suite))
    assert main(["compare", "--suite", str(tmp_path / "s.yaml"), "--runs", str(runs), "--measure", "to_target"]) == 2
    assert "declares no rollouts_to_target endpoint" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ('{"suite": "conditions_test", "runs": {"unif', "g4.json: not a readable condition result (JSONDecodeError: "),
    ("[]", "g4.json: not a condition result, a JSON list instead of a mapping; "),
    ('{"runs": {"uniform": {"0": {}}}}', "g4.json: not a condition result, it lacks setup, endpoint, lrs, "
                                         "validation_seeds, arms, lr, sweep; "),
    ('{"setup": {}, "endpoint": {}, "lrs": [], "validation_seeds": [], "arms": {}, "lr": {}, "sweep": {}, "runs": []}',
     "g4.json: not a condition result, it lacks runs (not a dict); "),
    ('{"setup": {}, "endpoint": {}, "lrs": [], "validation_seeds": [], "arms": {}, "lr": {}, "sweep": {}, "runs": {}}',
     "g4.json: a damaged condition result, no arm in runs; "),
    ('{"setup": {}, "endpoint": {}, "lrs": [], "validation_seeds": [], "arms": {}, "lr": {}, "sweep": {}, '
     '"runs": {"uniform": {"0": {}}}}',
     "g4.json: a damaged condition result, arm(s) 'uniform' without seeds, an entry in arms or a learning rate; "),
], ids=["truncated", "a-list", "no-keys", "runs-a-list", "no-arm", "arm-not-in-arms"])
def test_a_damaged_stored_condition_result_is_one_line_before_any_run(tmp_path, content, message, capsys):
    """A stored condition result cut short or edited by hand was read with json.loads and indexed: a
    JSONDecodeError or TypeError traceback, after the conditions before it had run. Now every stored result is
    read first and a damaged one named in one line with what to do."""
    from rlcurate.cli import main

    path, out = tmp_path / "suite.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(SMALL))
    out.mkdir()
    (out / "g4.json").write_text(content)
    assert main(["conditions", "--suite", str(path), "--out", str(out), "--only", "main", "g4"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"rlcurate conditions: error: {out / 'g4.json'}") and message in err, err
    assert err.rstrip().endswith("; delete it or pass --force to compute the condition afresh"), err
    assert not (out / "main.json").exists()  # refused before the condition listed first ran
