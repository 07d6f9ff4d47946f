"""Bad inputs to training (issue #12, "Training refuses what it cannot do right"): each is refused with
one line before any model loads, or handled and counted; none ends in a traceback, a silent wrong
result or lost work. Each test is one row of the issue's table of bad inputs."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rlcurate.cli import main
from rlcurate.errors import UserError
from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.tasks.base import Problem, Reward, prompt_tokens, render_chat, split_long_prompts
from rlcurate.train import Trainer, TrainConfig

REPO = Path(__file__).resolve().parents[1]
SPREAD = REPO / "data" / "tiny" / "spread"
TINY_CFG = REPO / "configs" / "tiny_uniform.yaml"


def _small(out: Path, **over) -> dict:
    cfg = {"model": str(SPREAD), "task": "arithmetic",
           "task_kwargs": {"levels": ["add2", "add3"], "n_train": 16, "n_test": 4},
           "strategy": "uniform", "seed": 0, "steps": 2, "prompts_per_step": 2, "group_size": 2,
           "max_new_tokens": 8, "eval_every": 0, "eval_prompts": 4, "eval_samples": 1, "checkpoint_every": 1,
           "threads": 1, "progress": False, "save_model": False, "out_dir": str(out)}
    cfg.update(over)
    return cfg


def _refused(capsys, argv, *needles):
    """Run the CLI in-process; it must exit 2 with exactly one non-empty stderr line naming ``needles``."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _train_refused(capsys, tmp_path, sets, *needles, config=TINY_CFG):
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--set", f"out_dir={out}"]
    for s in sets:
        argv += ["--set", s]
    line = _refused(capsys, argv, *needles)
    assert not out.exists(), "refused before any work: the run folder is not even made"
    return line


# ------------------------------------------------------------------------------ strategies
def test_misspelt_strategy_is_refused_with_a_suggestion(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=unifrom"], "unknown strategy 'unifrom'", "did you mean 'uniform'")


def test_composition_of_three_strategies_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=insight+ada_seq_balanced+dapo"], "at most two")


def test_misspelt_part_of_a_composition_is_named(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=insight+ada_seq_balansed"], "'ada_seq_balansed'",
                   "did you mean 'ada_seq_balanced'")


def test_strategy_kwarg_the_strategy_does_not_take(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=ada_seq_balanced", "strategy_kwargs={max_round: 3}"],
                   "does not take max_round", "did you mean 'max_rounds'")


def test_flat_kwarg_no_part_of_a_composition_takes(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=insight+ada_seq_balanced", "strategy_kwargs={nonsense: 1}"],
                   "no part of insight+ada_seq_balanced takes nonsense")


@pytest.mark.parametrize("spec,kwargs,needle", [
    ("ada_est+dapo", "{n_min: 3}", "n_min changes only ada_est's sampler and processors, which the composition takes "
                                   "from dapo instead"),
    ("ada_est+dapo", "{ada_est: {n_min: 3}}", "n_min changes only ada_est's sampler and processors"),
    ("dapo+insight", "{eta: 0.5}", "eta changes only insight's selector, which the composition takes from dapo")])
def test_an_option_of_the_part_a_composition_discards_is_refused(capsys, tmp_path, spec, kwargs, needle):
    """Before: accepted, and the run trained without it (a+b keeps a's selector and b's sampler)."""
    _train_refused(capsys, tmp_path, [f"strategy={spec}", f"strategy_kwargs={kwargs}"], needle)


def test_an_option_a_composition_keeps_is_taken():
    from rlcurate.curation import build_curator

    assert build_curator("uniform+ada_est", n_min=3).sampler.n_min == 3
    assert build_curator("insight+ada_est", eta=0.5, n_min=3).selector.eta == 0.5
    assert build_curator("ada_est+dapo", n_min=1).name == "ada_est+dapo"  # its default changes nothing: no harm
    # a flat option both parts take is kept where one part uses it (Ada-Est's sampler drops it, GVM's uses it)
    assert build_curator("ada_est+gvm", positive_threshold=0.5).sampler.positive_threshold == 0.5
    # options valid only together: each is judged with the others in place
    assert build_curator("uniform+knapsack", min_n=200, max_n=300).sampler.max_n == 300


def test_parts_compare_by_their_random_state():
    import random

    import numpy as np

    from rlcurate.curation.registry import _same_parts

    assert not _same_parts(random.Random(1), random.Random(2)) and _same_parts(random.Random(1), random.Random(1))
    assert not _same_parts(np.random.default_rng(1), np.random.default_rng(2))
    assert _same_parts(np.random.default_rng(1), np.random.default_rng(1))


def test_strategy_kwarg_value_the_strategy_rejects(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=ada_seq_balanced", "strategy_kwargs={correction: bogus}"],
                   "strategy 'ada_seq_balanced'",
                   "correction must be one of none, inverse_p, inverse_sqrt_p, got 'bogus'")


def test_a_bool_option_given_a_string_is_refused_and_a_whole_float_is_an_int(capsys, tmp_path):
    """hybrid="false" is a non-empty string, true to Python: it switched Ada-Est's hybrid rule on (so did every
    bool option of every strategy). A whole float for an int option (an author's own, unchecked) reached the
    strategy's arithmetic as a float; it is now the int it stands for."""
    from rlcurate.curation import build_curator

    _train_refused(capsys, tmp_path, ["strategy=ada_est", 'strategy_kwargs={hybrid: "false"}'],
                   "strategy 'ada_est'", "hybrid must be true or false, got 'false'")
    assert build_curator("ada_est", hybrid=False).sampler.hybrid is False
    n_min = build_curator("ada_est", n_min=3.0).sampler.n_min
    assert n_min == 3 and type(n_min) is int


def test_a_strategy_name_with_a_plus_cannot_be_registered():
    """``a+b`` composes two strategies, so a strategy named near+half was listed and then could not be used."""
    from dataclasses import dataclass

    from rlcurate.curation.registry import StrategyConfig, register

    with pytest.raises(TypeError, match=r"register\('near\+half'\): a strategy's name is a word without '\+'"):
        @register("near+half")
        @dataclass
        class NearHalf(StrategyConfig):
            """Prompts near one half."""


@pytest.mark.parametrize("kwargs,needle", [("{eta: -1}", "eta must be >= 0, got -1"), ("{K: 0}", "K must be >= 1"),
                                           ("{alpha0: -1}", "alpha0 must be > 0"), ("{K: 1.5}", "K must be an integer"),
                                           ("{eta: .nan}", "eta must be finite (no NaN or infinity), got nan"),
                                           ("{eta: three}", "eta must be numeric, got 'three'"),
                                           ("{success_threshold: .nan}", "success_threshold must be a finite number")])
def test_a_belief_selector_option_out_of_range_is_refused_before_the_model_loads(capsys, tmp_path, kwargs, needle):
    """Before: accepted by the checks, then a traceback at step 0 with a half-made run folder."""
    _train_refused(capsys, tmp_path, ["strategy=insight", f"strategy_kwargs={kwargs}"], "strategy 'insight'", needle)


def test_every_numeric_strategy_option_refuses_nan_and_the_ranges_are_checked_at_build():
    """Each registered strategy's number options are finite numbers (whole ones where the default is an int), so
    none reaches a step as NaN; options with a range refuse a value outside it when the curator is built, which the
    run's checks do before the model loads."""
    import dataclasses

    from rlcurate.curation.registry import _REGISTRY, _discover, build_curator

    _discover()
    checked = 0
    for name, cls in _REGISTRY.items():
        for f in dataclasses.fields(cls):
            if isinstance(f.default, bool) or not isinstance(f.default, (int, float)):
                continue
            with pytest.raises(UserError, match=f"strategy {name!r}.*{f.name}"):
                build_curator(name, **{f.name: float("nan")})
            checked += 1
    assert checked > 40
    for name, kwargs in (("mopps", {"target": -1}), ("gvm", {"alpha": -1}), ("gvm", {"filter_threshold": 2}),
                         ("sage", {"hint_max_new_tokens": 0}), ("sage_light", {"min_threshold": -0.1}),
                         ("dro", {"token_budget": 0}), ("insight", {"beta0": 0})):
        with pytest.raises(UserError, match=f"{next(iter(kwargs))}"):
            build_curator(name, **kwargs)


def test_sage_hint_mode_the_strategy_rejects(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["strategy=sage", "strategy_kwargs={hint_mode: users}"],
                   "strategy 'sage'", "hint_mode must be 'auto', 'prefix'", "got 'users'")


def test_sage_prefix_hints_on_a_task_that_cannot_place_them(capsys, tmp_path):
    # the tiny style without a scratchpad has no scratchpad to start: hints go into the user turn only
    _train_refused(capsys, tmp_path, ["strategy=sage", "strategy_kwargs={hint_mode: prefix}",
                                      "task_kwargs={scratchpad: false}"],
                   "strategy 'sage' with task 'arithmetic'", "takes hint_mode 'auto' or 'user'")


def test_validate_strategy_checks_without_building():
    from rlcurate.curation.registry import validate_strategy

    parts = validate_strategy("insight+ada_seq_balanced", {"insight": {}, "ada_seq_balanced": {"max_rounds": 2}})
    assert parts == [("insight", {}), ("ada_seq_balanced", {"max_rounds": 2})]
    with pytest.raises(UserError, match="strategy_kwargs must be a mapping"):
        validate_strategy("uniform", [1, 2])


# ------------------------------------------------------------------------------ tasks
def test_misspelt_task_is_refused_with_a_suggestion(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["task=gsm9k"], "not a known task", "did you mean 'gsm8k'")


def test_task_kwarg_the_task_does_not_take(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["task_kwargs={n_trian: 3}"], "task_kwargs", "n_trian",
                   "did you mean 'n_train'")


# ------------------------------------------------------------------------------ config files and --set
def test_malformed_yaml_config_names_the_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: data/tiny/spread\nsteps: [1, 2\nseed: 0\n")
    _train_refused(capsys, tmp_path, [], str(bad), "not valid YAML", "line", config=bad)


def test_a_key_given_twice_in_a_yaml_file_is_refused(capsys, tmp_path):
    """Plain YAML keeps the last of two equal keys silently; a config that sets lr twice is a mistake (#30)."""
    bad = tmp_path / "twice.yaml"
    bad.write_text("model: data/tiny/spread\nlr: 1.0e-4\nsteps: 3\nlr: 1.0e-3\n")
    _train_refused(capsys, tmp_path, [], str(bad), "not valid YAML at line 4", "duplicate key 'lr' (first at line 2)",
                   config=bad)


def test_clip_low_that_leaves_no_lower_clip_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["clip_low=2"], "clip_low must lie in [0, 1)", "no lower clip")


def test_a_warmup_longer_than_the_run_is_named(tmp_path):
    """A warm-up that cannot finish is said in a warning when the run starts (issue #30); not refused, since a
    short trial of a long config (a chapter's dry run) cuts its steps on purpose."""
    from rlcurate.train import TrainConfig

    cfg = TrainConfig.load(TINY_CFG, ["warmup_steps=5", "steps=5"])
    assert cfg.warmup_note() == "warmup_steps (5) is not fewer than the run's steps (5): the learning rate never reaches lr=0.0001"
    cut = TrainConfig.load(TINY_CFG, ["warmup_steps=20", "steps=100", "max_rollouts=640"])
    assert "(5, the steps max_rollouts=640 allows at 16 x 8 rollouts a step)" in cut.warmup_note()
    assert TrainConfig.load(TINY_CFG, ["warmup_steps=4", "steps=5"]).warmup_note() is None


def test_an_empty_out_dir_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["out_dir=''"], "out_dir must name a folder", "got ''")


def test_config_that_is_a_list_is_refused(capsys, tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- model: data/tiny/spread\n- steps: 3\n")
    _train_refused(capsys, tmp_path, [], str(bad), "must be a mapping", config=bad)


def test_missing_config_file(capsys, tmp_path):
    _train_refused(capsys, tmp_path, [], "config file not found", "nope.yaml", config=tmp_path / "nope.yaml")


@pytest.mark.parametrize("setting, needle", [
    ("lr=abc", "lr must be a number, got 'abc'"),
    ("steps=-1", "steps must be a positive integer, got -1"),
    ("lr=.inf", "lr must be a finite number"),
    ("stratgy=insight", "did you mean 'strategy'"),
    ("seed=[1", "cannot parse the value as YAML"),
    ("lr.x=1", "lr is not a mapping"),
    ("betas=[a, b]", "betas must be two numbers"),
    ("resume=maybe", "resume must be true or false"),
])
def test_bad_set_value_is_refused(capsys, tmp_path, setting, needle):
    _train_refused(capsys, tmp_path, [setting], needle)


# ------------------------------------------------------------------------------ model and out_dir
def test_missing_model_path_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["model=/does/not/exist"], "model='/does/not/exist'", "no such checkpoint")


def test_folder_without_checkpoint_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, [f"model={tmp_path}"], "holds no config.json")


def test_serve_missing_model_is_one_line(capsys):
    _refused(capsys, ["serve", "--model", "/does/not/exist"], "--model='/does/not/exist'", "no such checkpoint")


def test_out_dir_that_is_a_file(capsys, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    _refused(capsys, ["train", "--config", str(TINY_CFG), "--set", f"out_dir={f}"], "is a file, not a directory")
    _refused(capsys, ["train", "--config", str(TINY_CFG), "--set", f"out_dir={f}/run"], "cannot be made", "is a file")
    assert f.read_text() == "x"


def test_unwritable_out_dir_is_refused(monkeypatch, tmp_path):
    from rlcurate.train import preflight

    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)  # as root, chmod would not bite
    with pytest.raises(UserError, match="cannot be written: no write permission"):
        preflight.check_out_dir(str(tmp_path / "run"))


def test_an_out_dir_that_cannot_be_made_is_refused_even_where_os_access_says_yes(tmp_path):
    """Root passes every os.access test; a folder under /proc cannot be made all the same, and a command that
    checked only os.access trained (warmstart) or simulated (advise) to the end, then failed to save."""
    from rlcurate.train import preflight

    with pytest.raises(UserError, match=r"cannot be written: No such file or directory \(/proc\)"):
        preflight.check_out_dir("/proc/rlcurate-no-such-folder")
    preflight.check_out_dir(str(tmp_path / "run" / "deeper"))  # a folder that can be made: nothing left behind
    assert list(tmp_path.iterdir()) == []


def test_warmstart_and_the_dry_run_refuse_an_output_they_cannot_write_before_working(capsys, tmp_path):
    from rlcurate.cli import main

    for argv, needle in [
            (["warmstart", "--out", "/proc/x", "--steps", "2"], "--out /proc/x: cannot be written"),
            (["dryrun", "--config", str(TINY_CFG), "--json", str(tmp_path)], "a folder; give a file name")]:
        try:
            code = main(argv)
        except SystemExit as exc:  # warmstart says it through argparse
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# ------------------------------------------------------------------------------ group size
def test_group_size_one_is_refused(capsys, tmp_path):
    _train_refused(capsys, tmp_path, ["group_size=1"], "group_size=1", "advantage=grpo", "nothing is learned")


def test_group_size_one_with_a_pool_baseline_is_allowed_but_not_with_rloo():
    from rlcurate.curation import build_curator
    from rlcurate.train.preflight import check_group_size

    ada = build_curator("ada_seq_balanced")
    check_group_size(TrainConfig(group_size=1, strategy="ada_seq_balanced"), ada)  # p_hat of the pool
    with pytest.raises(UserError, match="advantage=rloo"):
        check_group_size(TrainConfig(group_size=1, strategy="ada_seq_balanced", advantage="rloo"), ada)


# ------------------------------------------------------------------------------ resume
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, one_thread):
    """A 2-step run with a checkpoint at step 2 (copied by each test that changes it)."""
    out = tmp_path_factory.mktemp("resume") / "run"
    Trainer(TrainConfig.from_dict(_small(out))).run()
    return out


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_resume_with_another_seed_is_refused_with_the_diff(capsys, tmp_path, finished_run):
    run = _copy_run(finished_run, tmp_path / "run")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_small(run)))
    before = (run / "config.json").read_text()
    line = _refused(capsys, ["train", "--config", str(cfg), "--set", "seed=1", "--set", "steps=6",
                             "--set", "strategy=insight"], "checkpoint at step 2", "seed: 0 -> 1",
                    "strategy: 'uniform' -> 'insight'", "resume=false")
    assert "steps" not in line.split("made with a different config:")[1].split(";")[0]  # steps may change
    assert (run / "config.json").read_text() == before  # the saved config still says seed 0


def test_resume_extending_steps_is_allowed_and_recorded(tmp_path, finished_run, one_thread, caplog):
    run = _copy_run(finished_run, tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="rlcurate.train.trainer"):
        summary = Trainer(TrainConfig.from_dict(_small(run, steps=3))).run()
    assert summary["steps"] == 3
    assert summary["config_changes"] == [{"step": 2, "changes": {"steps": [2, 3]}}]
    assert "steps: 2 -> 3" in caplog.text
    assert json.loads((run / "config.json").read_text())["steps"] == 3
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_resume_below_the_checkpoint_step_is_refused(tmp_path, finished_run):
    from rlcurate.train.preflight import check_resume

    with pytest.raises(UserError, match="past steps=1"):
        check_resume(TrainConfig.from_dict(_small(finished_run, steps=1)))


def test_resume_with_a_budget_below_what_was_spent_is_refused(finished_run):
    from rlcurate.train.preflight import check_resume

    spent = json.loads((finished_run / "checkpoint" / "trainer.json").read_text())["totals"]["rollouts"]
    assert check_resume(TrainConfig.from_dict(_small(finished_run, max_rollouts=spent + 4))) == {
        "max_rollouts": (0, spent + 4)}  # a budget above what was spent: allowed, and recorded
    with pytest.raises(UserError, match=f"has spent {spent} rollouts, more than max_rollouts=2"):
        check_resume(TrainConfig.from_dict(_small(finished_run, max_rollouts=2)))


def test_resume_changing_steps_of_a_cosine_schedule_is_refused(tmp_path, finished_run):
    from rlcurate.train.preflight import check_resume

    run = _copy_run(finished_run, tmp_path / "run")
    meta = json.loads((run / "checkpoint" / "trainer.json").read_text())
    meta["config"]["lr_schedule"] = "cosine"
    (run / "checkpoint" / "trainer.json").write_text(json.dumps(meta))
    check_resume(TrainConfig.from_dict(_small(run, lr_schedule="cosine")))  # the same steps: fine
    with pytest.raises(UserError, match="cosine learning-rate schedule"):
        check_resume(TrainConfig.from_dict(_small(run, lr_schedule="cosine", steps=4)))


# ------------------------------------------------------------------------------ rewards and gradients
class _NaNTask(ArithmeticTask):
    """Arithmetic whose verifier returns NaN for every other problem of each split (a broken reward)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.broken = {p.uid for split in ("train", "test") for p in self.problems(split)[::2]}

    def reward(self, problem, completion):
        if problem.uid in self.broken:
            return Reward(float("nan"), "broken")
        return super().reward(problem, completion)


def test_nan_rewards_are_left_out_and_counted(tmp_path, spread_policy, caplog):
    model, tok, _ = spread_policy
    task = _NaNTask(levels=["add2", "add3"], n_train=16, n_test=4)
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", steps=4, prompts_per_step=4, eval_every=4))
    with caplog.at_level(logging.WARNING, logger="rlcurate.train.trainer"):
        Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("nonfinite_reward_rollouts", 0) for r in rows) > 0
    assert rows[0]["step"] == 0 and rows[0]["eval/nonfinite_rewards"] == 2  # 2 of the 4 held-out prompts
    assert all(np.isfinite(r["reward_mean"]) and np.isfinite(r["loss"]) for r in rows if "loss" in r)
    assert "non-finite reward" in caplog.text
    state = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=False)["model"]
    assert all(torch.isfinite(v).all() for v in state.values())


def test_nonfinite_gradient_skips_the_optimizer_step(tmp_path, spread_policy):
    from rlcurate.train.loss import TrainSample, aggregation_coefficients

    model, tok, task = spread_policy
    tr = Trainer(TrainConfig.from_dict(_small(tmp_path / "run")), model=copy.deepcopy(model), tokenizer=tok,
                 task=task)
    first = next(tr.model.parameters())
    first.register_hook(lambda g: torch.full_like(g, float("nan")))
    samples = [TrainSample([5, 6, 7], [8, 9, 10], 1.0)]
    aggregation_coefficients(samples, "token-mean", 8)
    before = [p.detach().clone() for p in tr.model.parameters()]
    out = tr.policy.optimize(samples)
    assert out["nonfinite_grad_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


# ------------------------------------------------------------------------------ prompt length
class _HugeQuestionTask(ArithmeticTask):
    """Arithmetic plus one training question of 5 MB."""

    def problems(self, split="train"):
        out = super().problems(split)
        if split == "train":
            out = [Problem(uid="huge", question="12+34 " * 850_000, answer="46")] + out
        return out

    def render(self, problem, tokenizer, hint=None):
        if problem.uid == "huge":
            return render_chat(tokenizer, [{"role": "user", "content": problem.question}])
        return super().render(problem, tokenizer, hint=hint)


def test_a_5mb_question_is_left_out_and_counted(tmp_path, spread_policy, caplog):
    model, tok, _ = spread_policy
    task = _HugeQuestionTask(levels=["add2", "add3"], n_train=16, n_test=4)
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", steps=1))
    with caplog.at_level(logging.WARNING, logger="rlcurate.train.trainer"):
        tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)
        summary = tr.run()
    assert "huge" not in {p.uid for p in tr.train_problems}
    assert len(tr.train_problems) == len(task.problems("train")) - 1
    assert summary["prompts_too_long"] == {"train": 1, "test": 0, "max_prompt_tokens": 4096}
    assert "left out 1 training prompt(s) longer than max_prompt_tokens=4096" in caplog.text


def test_prompt_length_is_bounded_without_tokenizing_a_huge_text():
    class Recorder:
        def __init__(self):
            self.lengths = []

        def encode(self, text, add_special_tokens=False):
            self.lengths.append(len(text))
            return list(range(len(text)))  # one token per character

    rec = Recorder()
    assert prompt_tokens("x" * 5_000_000, rec, 100) > 100
    assert max(rec.lengths) < 10_000
    kept, too_long = split_long_prompts([Problem("a", "1+1", "2"), Problem("b", "y" * 500, "2")],
                                        lambda p: p.question, Recorder(), 100)
    assert [p.uid for p in kept] == ["a"] and [(p.uid, n) for p, n in too_long] == [("b", 500)]


def test_every_prompt_too_long_is_refused(tmp_path, spread_policy):
    model, tok, task = spread_policy
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", max_prompt_tokens=3))
    with pytest.raises(UserError, match="every training prompt .* longer than max_prompt_tokens=3"):
        Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)


def test_more_prompts_a_step_than_the_pool_holds_is_refused_before_the_model_loads(tmp_path, spread_policy, capsys):
    """``prompts_per_step`` beyond the training pool: the belief selectors raised a traceback at the first step
    (they cannot choose that many distinct prompts), the others repeated prompts or took fewer without a word.
    Refused before the run folder is made, and again once prompts too long are left out."""
    _train_refused(capsys, tmp_path, ["strategy=insight", "prompts_per_step=3000"],
                   "prompts_per_step=3000 is more than the 2304 training prompts of task 'arithmetic'",
                   "lower prompts_per_step to 2304 or less")
    _train_refused(capsys, tmp_path, ["prompts_per_step=2305"], "more than the 2304 training prompts")
    model, tok, _ = spread_policy
    task = _HugeQuestionTask(levels=["add2", "add3"], n_train=16, n_test=4)  # 33 prompts, "huge" too long
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", prompts_per_step=33))
    with pytest.raises(UserError, match="more than the 32 training prompts of task 'arithmetic', after 1 longer "
                                        "than max_prompt_tokens=4096 were left out"):
        Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)


def test_a_half_written_checkpoint_alone_is_removed_with_a_warning_that_says_so(tmp_path, spread_policy, caplog):
    """A run that failed while writing its first checkpoint leaves checkpoint.tmp and nothing to resume; the same
    command (resume=true) starts from step 0 and says it removed that, not that "resume=false" did."""
    model, tok, task = spread_policy
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", steps=1))
    (tmp_path / "run" / "checkpoint.tmp").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="rlcurate.train.trainer"):
        tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task)
    assert tr.step == 0 and not (tmp_path / "run" / "checkpoint.tmp").exists()
    assert "no complete checkpoint to resume from; removed checkpoint.tmp" in caplog.text, caplog.text
    assert "resume=false" not in caplog.text


def test_a_checkpoint_whose_curator_state_no_longer_loads_is_one_line(tmp_path, spread_policy):
    """An author who renames a key of state_dict and resumes got a KeyError traceback from load_state_dict."""
    from rlcurate.curation.base import Curator, Selector

    class Renamed(Selector):
        def load_state_dict(self, state):
            self.rows = state["rows"]  # saved as "epoch" and "cursor"

    model, tok, task = spread_policy
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", steps=2, checkpoint_every=1))
    Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task).run()
    cfg = TrainConfig.from_dict(_small(tmp_path / "run", steps=3, checkpoint_every=1))
    with pytest.raises(UserError, match=r"trainer.json: the curator state saved at step 2 does not load into strategy "
                                        r"'uniform' \(KeyError: 'rows'\): its state_dict changed since the checkpoint"):
        Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, task=task, curator=Curator(Renamed()))


# ------------------------------------------------------------------------------ rlcurate runs
def _suite(tmp_path, runs, **extra) -> Path:
    suite = {"name": "t", "base": str(TINY_CFG), "overrides": {"model": str(SPREAD), "steps": 1},
             "seeds": [0], "runs": runs, **extra}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _runs_refused(capsys, tmp_path, suite, *needles, extra=()):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    line = _refused(capsys, ["runs", "--suite", str(suite), "--out", str(out), "--scratch", str(scratch), *extra],
                    *needles)
    assert not out.exists() and not scratch.exists(), "refused before any run starts"
    return line


def test_runs_unknown_suite_file(capsys, tmp_path):
    _runs_refused(capsys, tmp_path, tmp_path / "nope.yaml", "suite file not found")


def test_runs_malformed_suite_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nruns: {a: {}\n")
    _runs_refused(capsys, tmp_path, bad, "not valid YAML", "line")


def test_runs_suite_that_is_a_list(capsys, tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- name: t\n")
    _runs_refused(capsys, tmp_path, bad, "a suite must be a mapping")


def test_runs_unknown_run_name(capsys, tmp_path):
    _runs_refused(capsys, tmp_path, _suite(tmp_path, {"uniform": {}, "dapo": {"strategy": "dapo"}}),
                  "unknown run(s) unifrm", "did you mean 'uniform'", extra=["--only", "unifrm"])


def test_runs_with_one_invalid_run_config_start_nothing(capsys, tmp_path):
    suite = _suite(tmp_path, {"good": {}, "bad": {"lr": "abc"}})
    _runs_refused(capsys, tmp_path, suite, "run 'bad'", "lr must be a number")


def test_runs_with_a_misspelt_strategy_start_nothing(capsys, tmp_path):
    suite = _suite(tmp_path, {"good": {}, "typo": {"strategy": "insigth"}})
    _runs_refused(capsys, tmp_path, suite, "run 'typo'", "did you mean 'insight'")


def test_runs_seeds_that_are_not_integers(capsys, tmp_path):
    _runs_refused(capsys, tmp_path, _suite(tmp_path, {"uniform": {}}), "--seeds must be comma-separated integers",
                  extra=["--seeds", "0,one"])


def test_train_subset_restricts_the_pool_to_the_audited_prompts(tmp_path):
    """``train_subset`` (chapter 10's filtered pool): the trainer trains only on the uids of the file, in
    the task's order; a file naming none of them is refused in one line."""
    import json

    from rlcurate.tasks.registry import get_task
    from rlcurate.train import TrainConfig
    from rlcurate.train.preflight import train_subset

    task = get_task("arithmetic", n_train=8, n_test=4)
    problems = task.problems("train")
    keep = [problems[1].uid, problems[5].uid, problems[2].uid]
    f = tmp_path / "subset.jsonl"
    f.write_text("".join(json.dumps({"uid": u, "question": "?"}) + "\n" for u in keep))
    cfg = TrainConfig(task="arithmetic", task_kwargs={"n_train": 8, "n_test": 4}, train_subset=str(f))
    assert [p.uid for p in train_subset(cfg, problems)] == [problems[i].uid for i in (1, 2, 5)]
    f.write_text(json.dumps({"uid": "nope"}) + "\n")
    with pytest.raises(UserError, match="none of its 1 uids"):
        train_subset(cfg, problems)


def test_a_misspelt_model_is_refused_at_once_not_after_a_minute_of_hub_retries(tmp_path, monkeypatch, capsys):
    """`smolm2` and `ckpts/tiyn` (whose folder `ckpts` is here) were tried on the Hub, retried for about
    48 s offline, and refused with the Hub's error; each is a typo, named with its correction."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpts" / "tiny").mkdir(parents=True)
    _train_refused(capsys, tmp_path, ["model=smolm2"], "did you mean 'smollm2'")
    _train_refused(capsys, tmp_path, ["model=ckpts/tiyn"], "did you mean ckpts/tiny", "read as a local path")


def test_a_config_names_its_checkpoint_relative_to_the_repository_from_any_folder(tmp_path, monkeypatch, capsys):
    """Issue #30: `model: data/tiny/spread` worked only from the repository root. A relative path that does not
    exist from the current folder is read from the folders above the config file; one found nowhere says which
    folder a relative path is read from."""
    from rlcurate.train import TrainConfig

    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig.load(TINY_CFG)
    assert Path(cfg.model).is_absolute() and (Path(cfg.model) / "config.json").is_file()
    _train_refused(capsys, tmp_path, ["model=./no/such/checkpoint"], "no such checkpoint directory",
                   f"a relative path is read from the current folder {tmp_path}")
