"""``rlcurate warmstart`` / ``python -m rlcurate.models.warmstart``: the warm-start from the command
line (chapter 4). Its options are the fields of :class:`~rlcurate.models.warmstart.config.WarmStartConfig`
(:mod:`rlcurate.config_cli`), plus ``--out``, ``--save-at``, ``--hidden-size``, ``--layers`` and
``--no-progress``; :func:`to_argv` writes a configuration back as the command that reproduces it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

from rlcurate.models.warmstart.config import MAX_MIXED, WarmStartConfig, parse_save_at

__all__ = ["COMMAND", "build_parser", "config_from_args", "config_options", "main", "to_argv"]

COMMAND = "python -m rlcurate.models.warmstart"
"""How a checkpoint's README writes the command (the same as ``rlcurate warmstart``)."""


def config_options():
    """The options of :class:`WarmStartConfig` on the command line, built from its field docstrings
    (``model``, a dict of Qwen2 config overrides, is set by ``--hidden-size`` and ``--layers``)."""
    from rlcurate.config_cli import ConfigOptions, Option

    return ConfigOptions(WarmStartConfig, exclude=("model",), options={
        "scratchpad": Option(help="train on direct answers '#answer' only"),
        "hint_placement": Option(choices=("assistant", "user")),
        "hint_eval": Option(help="skip the hint-level evaluation at saved stages"),
        "schedule": Option(choices=("constant", "cosine")),
    })


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``rlcurate warmstart`` / ``python -m rlcurate.models.warmstart`` (chapter 4)."""
    import rlcurate.models.warmstart as package
    from rlcurate._help import ArgumentParser, HelpFormatter, plain, wrap

    doc = package.__doc__
    p = ArgumentParser(prog="rlcurate warmstart", description=wrap(doc.split("\n\n")[0]),
                       formatter_class=HelpFormatter,
                       epilog="the checkpoints in data/tiny come from:\n" + plain(
                           doc.split("::\n")[1].split("\n\n(")[0]).replace(COMMAND, "rlcurate warmstart"))
    p.add_argument("--out", required=True, help="output directory (stages go to OUT/NAME)")
    p.add_argument("--save-at", default=None,
                   help=f"stages to save: NAME=STEP,... or STEP,...; NAME={MAX_MIXED} saves the evaluated step "
                        "with the most mixed held-out prompts")
    config_options().add_to(p)
    p.add_argument("--hidden-size", type=int, default=None, help="override the model width (default 128)")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers (default 4)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--force", action="store_true", help="overwrite checkpoints already in OUT")
    return p


def config_from_args(args: argparse.Namespace) -> WarmStartConfig:
    """A validated :class:`WarmStartConfig` from parsed command-line arguments (chapter 4)."""
    model: dict = {}
    for flag, v in (("--hidden-size", args.hidden_size), ("--layers", args.layers)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}")
    if args.hidden_size is not None:
        model.update(hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size)
    if args.layers is not None:
        model.update(num_hidden_layers=args.layers)
    return config_options().build(args, model=model).validate()


def to_argv(cfg: WarmStartConfig, out, save_at: dict) -> list[str]:
    """Command-line arguments that reproduce ``cfg`` (the inverse of :func:`config_from_args`); written
    into each checkpoint's README (chapter 4). ``--steps`` and ``--seed`` are always written, the
    other options where they differ from what the rest implies."""
    options = config_options()
    argv = ["--out", str(out), *options.argv(cfg, names=("steps", "seed"), always=("steps", "seed"))]
    named = {s: n for s, n in save_at.items() if n}
    if named:
        argv += ["--save-at", ",".join(f"{n}={s}" for s, n in named.items())]
    argv += options.argv(cfg, names=[n for n in options.fields if n not in ("steps", "seed")])
    if "hidden_size" in cfg.model:
        argv += ["--hidden-size", str(cfg.model["hidden_size"])]
    if "num_hidden_layers" in cfg.model:
        argv += ["--layers", str(cfg.model["num_hidden_layers"])]
    return argv


def out_problem(out: Path, save_at: dict, force: bool) -> str | None:
    """Why ``out`` cannot take this run's checkpoints (checked before training), or None: it is or lies under a
    file, or (without ``force``) it or one of its stage folders already holds a checkpoint."""
    existing = next(p for p in [out, *out.absolute().parents] if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file"
    from rlcurate.errors import UserError
    from rlcurate.train.preflight import check_out_dir

    try:
        check_out_dir(str(out))
    except UserError as exc:
        return str(exc).removeprefix(f"out_dir={str(out)!r} ")
    if not force:
        held = [p for p in [out, *(out / n for n in save_at.values() if n)] if (p / "config.json").exists()]
        if held:
            return f"{held[0]} already holds a checkpoint; pass --force to overwrite it, or another --out"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlcurate warmstart`` and ``python -m rlcurate.models.warmstart`` (chapter 4)."""
    from rlcurate.models.warmstart.training import train

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        save_at = parse_save_at(args.save_at, cfg.steps)
    except ValueError as exc:
        parser.error(config_options().flag_message(str(exc)))
    problem = out_problem(Path(args.out), save_at, args.force)
    if problem:
        parser.error(f"--out {args.out}: {problem}")
    command = COMMAND + " " + shlex.join(to_argv(cfg, args.out, save_at))
    result = train(cfg, args.out, save_at, command=command, progress=not args.no_progress)
    for name, stage in result["stages"].items():
        ev = stage["eval"]["overall"] if stage["eval"] else {}
        print(f"{name}: step {stage['step']}, {stage['wall_s']:.0f} s, mean pass {ev.get('mean_pass')}, "
              f"mixed {ev.get('mixed_share')} -> {stage['path']}", file=sys.stderr)
    return 0
