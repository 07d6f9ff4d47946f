"""Command-line options built from a configuration dataclass (issue #14, :mod:`rlcurate.config_cli`):
help from the field docstrings with defaults, args -> dataclass -> args round trips, one-line errors,
and the audit and warm-start command lines that use it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import pytest

from rlcurate._help import ArgumentParser, HelpFormatter
from rlcurate.config_cli import ConfigOptions, Option, field_docs, help_text
from rlcurate.errors import UserError


@dataclass
class Toy:
    """A configuration with a field of every kind the helper knows."""

    name: str
    """Which model (required: no default)."""
    steps: int = 10
    """Optimizer steps."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    limit: int | None = None
    """Stop after this many samples (None: all)."""
    shuffle: bool = True
    """Shuffle the data."""
    verbose: bool = False
    """Print more."""
    levels: tuple[str, ...] = ("add2", "add3")
    """Levels to train on."""
    weights: tuple[float, ...] | None = None
    """Weight of each level."""
    stop: tuple[str, ...] = ()
    """Stop strings, which may hold commas."""
    kwargs: dict = field(default_factory=dict)
    """Options of the task, 100% optional."""
    mode: str = "fast"
    """``fast`` or ``slow``."""


def options() -> ConfigOptions:
    return ConfigOptions(Toy, options={"stop": Option(sep=None), "mode": Option(choices=("fast", "slow")),
                                       "shuffle": Option(help="keep the data's order")})


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="toy", formatter_class=HelpFormatter)
    options().add_to(p)
    return p


def test_help_comes_from_the_field_docstrings_with_defaults(capsys):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--steps STEPS optimizer steps (default: 10)" in out
    assert "--lr LR peak learning rate of AdamW (default: 0.001)" in out
    assert "--no-shuffle keep the data's order" in out and "--verbose print more" in out
    assert "levels to train on (comma-separated) (default: add2,add3)" in out
    assert "stop strings, which may hold commas (repeatable)" in out
    assert "--kwargs JSON options of the task, 100% optional (default: {})" in out
    assert "--mode {fast,slow} fast or slow (default: fast)" in out
    assert "(default: None)" not in out and "``" not in out and "(default: True)" not in out


def test_help_text_is_plain_lower_case_without_a_full_stop():
    assert help_text("Most tokens per completion.") == "most tokens per completion"
    assert help_text("AdamW betas.") == "AdamW betas"
    assert help_text("A run counts when ``score >= t``.") == "a run counts when score >= t"
    assert help_text("Up to 50% of it.") == "up to 50%% of it"


def test_args_to_dataclass_and_back():
    opts, p = options(), parser()
    cfg = opts.build(p.parse_args(["--name", "m", "--steps", "3", "--no-shuffle", "--levels", "add2, mul2x1",
                                   "--weights", "1,2.5", "--stop", "a,b", "--stop", "\n", "--kwargs", '{"n": 2}',
                                   "--limit", "7", "--verbose", "--mode", "slow"]))
    assert cfg == Toy(name="m", steps=3, shuffle=False, levels=("add2", "mul2x1"), weights=(1.0, 2.5),
                      stop=("a,b", "\n"), kwargs={"n": 2}, limit=7, verbose=True, mode="slow")
    argv = opts.argv(cfg)
    assert opts.build(p.parse_args(argv)) == cfg
    assert opts.build(p.parse_args(["--name", "m"])) == Toy(name="m")  # the defaults are the dataclass's
    assert opts.argv(Toy(name="m")) == ["--name", "m"]  # a default is left out ...
    assert opts.argv(Toy(name="m"), always=("steps",)) == ["--name", "m", "--steps", "10"]  # ... unless asked


def test_a_value_derived_from_other_fields_is_left_out():
    """The warm-start's level weights default to TINY_LEVEL_WEIGHTS for the default levels only."""
    from rlcurate.models.warmstart import TINY_LEVEL_WEIGHTS, WarmStartConfig
    from rlcurate.models.warmstart.cli import config_options

    opts = config_options()
    assert "--level-weights" not in opts.argv(WarmStartConfig())
    assert WarmStartConfig().level_weights == TINY_LEVEL_WEIGHTS
    custom = WarmStartConfig(levels=("add2", "add3"), level_weights=(1.0, 3.0))
    assert opts.argv(custom)[-2:] == ["--level-weights", "1,3"]


def test_a_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--name", "m", "--steps", "ten"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("toy: error: argument --steps: invalid int value: 'ten'")
    opts = options()
    for argv, message in [(["--kwargs", "{n: 1}"], "--kwargs is not valid JSON"),
                          (["--kwargs", "[1]"], "--kwargs must be a JSON object, got '[1]'"),
                          (["--weights", "1,x"], "--weights must be comma-separated numbers, got '1,x'")]:
        with pytest.raises(UserError, match=re.escape(message)):
            opts.values(parser().parse_args(["--name", "m", *argv]))
    assert opts.flag_message("steps must be >= 1, got 0") == "--steps must be >= 1, got 0"
    assert opts.flag_message("shuffle must be True or False") == "--shuffle must be True or False"
    assert opts.flag_message("nothing must change") == "nothing must change"


def test_one_implementation_of_field_docs():
    from rlcurate.train.config import TrainConfig
    from rlcurate.train.config import field_docs as train_field_docs

    assert train_field_docs() == field_docs(TrainConfig) and "group_size" in train_field_docs()
    assert field_docs(Toy)["kwargs"] == "Options of the task, 100% optional."


def test_every_audit_field_is_an_option_with_the_dataclass_default():
    from rlcurate.audit import AuditConfig
    from rlcurate.audit.cli import build_parser, config_options

    values = config_options().values(build_parser().parse_args(["--model", "m"]))
    assert set(values) == {f.name for f in dataclasses.fields(AuditConfig)}
    assert AuditConfig(**values) == AuditConfig(model="m")


def test_every_warmstart_field_but_the_model_overrides_is_an_option_with_its_default():
    from rlcurate.models.warmstart import WarmStartConfig, build_parser, config_from_args, to_argv

    args = build_parser().parse_args(["--out", "x"])
    assert config_from_args(args) == WarmStartConfig().validate()
    cfg = WarmStartConfig(steps=7, eval_temperature=0.5, betas=(0.8, 0.9), min_lr_ratio=0.2, schedule="cosine",
                          model={"hidden_size": 64, "intermediate_size": 256})
    argv = to_argv(cfg, "x", {})
    assert argv[:6] == ["--out", "x", "--steps", "7", "--seed", "0"]
    assert config_from_args(build_parser().parse_args(argv)) == cfg
