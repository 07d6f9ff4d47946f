"""The ``rlcurate`` command line: ``rlcurate <command> [options]``, or ``python -m rlcurate``.

``rlcurate --help`` prints :data:`USAGE`; each command's ``--help`` lists its options with their
defaults, in plain text (:mod:`rlcurate._help`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlcurate._help import ArgumentParser, HelpFormatter, wrap

USAGE = """\
usage: rlcurate <command> [options]
       python -m rlcurate <command> [options]

commands:
  train        GRPO training with a curation strategy (chapter 5)
  audit        the variance audit: N runs per sample, then a summary (chapter 4)
  advise       from an audit to a decision: what curation could save on your pool (chapters 4, 11)
  warmstart    supervised warm-start of the tiny model (chapter 4)
  serve        an OpenAI-compatible HTTP server for a checkpoint (chapter 4)
  runs         the reference runs of a suite, one JSON file per run and seed (chapters 5-10)
  compare      the paired comparison of a suite's arms at equal compute (chapter 10)
  conditions   the conditions map in the simulated world: when curation pays (chapter 11)
  plan         predicted GPU memory and GPU-hours of configs and suites; refuses what does not fit (A1)
  dryrun       a GPU configuration for a step, random weights of its real architecture (appendix A1)
  strategies   the curation strategies, and how to combine two of them

Run 'rlcurate <command> --help' (or 'rlcurate help <command>') for a command's options.

The data sets of the tasks gsm8k, math, math500, math_l3to5 and countdown are read from the
folder named by the environment variable RLCURATE_DATA_DIR (or the task option data_dir), else
from the Hugging Face Hub; see the README. '--model smollm2' is the offline SmolLM2-135M-Instruct;
with the arithmetic task it picks the task's chat style.
"""


def _train(argv: list[str]) -> int:
    from rlcurate.stopping import end_with_parent
    from rlcurate.train.config import TrainConfig, field_docs

    end_with_parent()  # a run started by `rlcurate runs` stops at a checkpoint when `runs` dies

    parser = ArgumentParser(
        prog="rlcurate train", description=wrap(
            "GRPO training with a pluggable curation strategy (chapter 5). With model smollm2 and the "
            "arithmetic task, the task's chat style is used unless task_kwargs give a style."),
        formatter_class=HelpFormatter, epilog=_config_keys_help(TrainConfig, _live_docs(field_docs())))
    parser.add_argument("--config", help="YAML file with config keys (defaults for the rest)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key; values are parsed as YAML (repeatable)")
    args = parser.parse_args(argv)
    # a bad config raises rlcurate.errors.UserError: one line from main(), no usage dump
    if args.config:
        config = TrainConfig.load(args.config, args.overrides)
    else:
        from rlcurate.train.config import apply_overrides

        config = TrainConfig.from_dict(apply_overrides({}, args.overrides), source="--set")
    from rlcurate.presets import task_kwargs_for

    config.task_kwargs, note = task_kwargs_for(config.model, config.task, config.task_kwargs)
    if note:
        print(f"rlcurate train: {note}", file=sys.stderr)
    from rlcurate.train.preflight import preflight

    task, curator, _ = preflight(config)  # every check that needs no model, before the model loads
    from rlcurate.train import Trainer

    summary = Trainer(config, task=task, curator=curator).run()
    print(format_train_summary(summary, config.out_dir))
    return 0


RHO_MIN_STEPS = 3
"""Steps after the first that ``rlcurate train`` needs before it prints rho."""


def train_to_generate_ratio(steps: list[dict]) -> tuple[float, int] | None:
    """rho, the cost of training on a rollout relative to generating one (chapter 10's cost currencies), from a
    run's own per-step times: the median over the steps after the first (which pays for warm-up) of
    (time/train / samples_nonzero_adv) / (time/generate / rollouts), and how many steps it took. The step's
    generation side includes scoring and the strategy's choices, its training side the update and ``observe``;
    on a machine shared with other work it is an estimate (``bench/bench_rho.py`` measures it with nothing else
    running). ``None`` with fewer than :data:`RHO_MIN_STEPS` steps that trained a rollout."""
    import statistics

    ratios = [(r["time/train"] / r["samples_nonzero_adv"]) / (r["time/generate"] / r["rollouts"])
              for r in steps if r.get("step", 0) >= 2
              and all((r.get(k) or 0) > 0 for k in ("time/train", "samples_nonzero_adv", "time/generate", "rollouts"))]
    return (statistics.median(ratios), len(ratios)) if len(ratios) >= RHO_MIN_STEPS else None


def format_train_summary(summary: dict, out_dir: str) -> str:
    """What ``rlcurate train`` prints at the end: the held-out evaluation at the start and at the end, the
    run's size and time; the whole summary is ``out_dir/summary.json``."""
    first, final = summary.get("first_eval") or {}, summary.get("final_eval") or {}
    totals = summary.get("totals") or {}
    lines = [f"{'out_dir':<16}{out_dir}"]
    if "steps" in summary:
        lines.append(f"{'steps':<16}{summary['steps']} ({totals.get('rollouts', 0):,} rollouts, "
                     f"{totals.get('generated_tokens', 0):,} generated tokens)")
    keys = [k for k in final if k.startswith("eval/") and k != "eval/grid"]
    if keys:
        lines.append(f"{'held-out':<16}{'start':>8}{'end':>8}")
        for k in keys:
            start = first.get(k)
            lines.append(f"  {k[5:]:<14}{'' if start is None else f'{start:.3f}':>8}{final[k]:>8.3f}")
    else:
        lines.append(f"{'held-out':<16}no evaluation (eval_every = 0)")
    if any(k.startswith("time/") for k in totals):
        lines.append(f"{'time':<16}" + ", ".join(f"{k[5:]} {totals[k]:.0f} s" for k in ("time/generate", "time/train",
                                                                                     "time/eval") if k in totals))
    metrics = Path(out_dir) / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    rho = train_to_generate_ratio([r for r in steps if "time/train" in r])
    lines.append(f"{'rho':<16}" + (
        f"{rho[0]:.2f} (training a rollout / generating one: median of {rho[1]} steps after the first, this machine; "
        "chapter 10)" if rho else f"n/a (needs {RHO_MIN_STEPS} steps after the first that train a rollout; chapter 10)"))
    lines.append(f"{'summary':<16}{Path(out_dir) / 'summary.json'}")
    return "\n".join(lines)


def _live_docs(docs: dict[str, str]) -> dict[str, str]:
    """The task and strategy keys' help with the names the registries hold now (a docstring's list goes stale)."""
    from rlcurate.curation.registry import available
    from rlcurate.tasks import available_tasks

    return {**docs, "task": f"Prompt source and verifier: {', '.join(available_tasks())}.",
            "strategy": f"Curation strategy (chapters 6-11): {', '.join(available())}; combine a selector with a "
                        f"sampler as insight+dapo ('rlcurate strategies NAME' describes one)."}


def _config_keys_help(cls, docs: dict[str, str]) -> str:
    """The epilog of ``rlcurate train --help``: every config key with its default and its docstring."""
    import dataclasses

    lines = ["config keys (in the YAML file, or --set key=value), with their defaults:"]
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  {f.name} = {default}")
        if f.name in docs:
            lines.append(wrap(docs[f.name], indent="      "))
    return "\n".join(lines)


_COMPOSITION = (
    "a+b combines two strategies: the selector of a (which prompts each step trains on) with the "
    "sampler and processors of b (how many rollouts each prompt gets; which are kept, and with what "
    "weight), e.g. insight+ada_seq_balanced. Options go in strategy_kwargs, flat (each part takes "
    "those it knows) or split as {a: {...}, b: {...}}.")

_OWN = ("A strategy of your own is one file (src/rlcurate/curation/README.md): name it in RLCURATE_STRATEGIES "
        "(paths or modules, separated by ':'), and it is listed here, checked by --check and trained by "
        "rlcurate train --set strategy=NAME.")


def _strategy_doc(name: str, full: bool) -> str:
    """A strategy's description, the docstring of its configuration class: the first paragraph (the
    list), or all of it with every option, its default and its docstring (``full``)."""
    import inspect

    from rlcurate.config_cli import field_docs
    from rlcurate.curation.registry import config_class, options

    cls = config_class(name)
    doc = inspect.cleandoc(cls.__doc__ or "")
    if not full:
        return wrap(doc.split("\n\n")[0], indent=" " * 24)[24:]
    text = [name, "", "\n\n".join(wrap(par, indent="  ") for par in doc.split("\n\n")), ""]
    defaults = options(name)
    if not defaults:
        text.append("  options: none")
        return "\n".join(text)
    docs = field_docs(cls)
    text.append("  options (strategy_kwargs) and their defaults:")
    for key, default in defaults.items():
        text.append(f"    {key} = {default!r}")
        if docs.get(key):
            text.append(wrap(docs[key], indent=" " * 8))
    return "\n".join(text)


def _strategies(argv: list[str]) -> int:
    from rlcurate.curation import available
    from rlcurate.errors import UserError

    parser = ArgumentParser(
        prog="rlcurate strategies", formatter_class=HelpFormatter,
        description=wrap("List the curation strategies (the strategy key of a training config; chapters "
                         "5-10), or describe some of them in full: every option with its default and what "
                         "it does ('rlcurate strategies NAME', or 'rlcurate strategies --help NAME')."),
        epilog=wrap(_COMPOSITION) + "\n\n" + wrap(_OWN))
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="strategies to describe with their options, e.g. insight or insight+ada_seq_balanced")
    parser.add_argument("--check", action="store_true",
                        help="check that each NAME keeps the strategy contract in the simulated world (described, "
                             "deterministic, resumes exactly, composes, numpy alone: rlcurate.contract); "
                             "seconds each")
    parser.add_argument("--options", default=None, metavar="YAML",
                        help="with --check: the strategy's options as a YAML mapping, e.g. '{k: 3}' for skip_solved")
    named = [a for a in argv if not a.startswith("-")]
    if named and any(a in ("-h", "--help") for a in argv):  # 'rlcurate strategies --help NAME': describe NAME
        argv = [a for a in argv if a not in ("-h", "--help")]
    args = parser.parse_args(argv)
    names = available()
    if args.options is not None and not args.check:
        raise UserError("--options: only with --check and the NAME of the strategy checked, e.g. 'rlcurate "
                        "strategies insight --check --options \"{eta: 0.5}\"' (a training config takes "
                        "strategy_kwargs)")
    if args.check and not args.names:
        raise UserError("--check: name the strategies to check, e.g. 'rlcurate strategies insight --check' "
                        "('rlcurate strategies' alone lists them)")
    if not args.names:
        print("curation strategies (the strategy key of a training config):\n")
        for name in names:
            print(f"  {name:20s}  {_strategy_doc(name, full=False)}")
        print("\n" + wrap(_COMPOSITION) + "\n\n'rlcurate strategies NAME' describes one strategy and its options.")
        return 0
    out = []
    for spec in args.names:
        parts = [p.strip() for p in spec.split("+")]
        for p in parts:
            if p not in names:
                import difflib

                close = difflib.get_close_matches(p, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UserError(f"unknown strategy {p!r}{hint}; 'rlcurate strategies' lists them: {', '.join(names)} "
                                f"(a strategy in a file of your own: RLCURATE_STRATEGIES=path/to/it.py)")
        if len(parts) > 2:
            raise UserError(f"{spec!r}: a composition has two parts, selector+sampler")
        if len(parts) == 2:
            out.append(f"{spec}: the selector of {parts[0]} with the sampler and processors of {parts[1]}.")
        out += [_strategy_doc(p, full=True) for p in parts]
    composed = [spec for spec in args.names if "+" in spec]
    if args.check and composed:
        parts = " ".join(dict.fromkeys(p.strip() for spec in composed for p in spec.split("+")))
        raise UserError(f"--check: {composed[0]!r} is a composition; check each part ('rlcurate strategies {parts} "
                        f"--check'): the check of a strategy runs it composed with every other one, both ways")
    if args.check:
        return _check_strategies(args.names, _yaml_mapping(args.options, "--options"))
    print("\n\n".join(out))
    return 0


def _yaml_mapping(text: str | None, what: str) -> dict:
    import yaml

    from rlcurate.errors import UserError

    if text is None:
        return {}
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{what}: cannot parse {text!r} as YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(value, dict):
        raise UserError(f"{what}: must be a YAML mapping such as '{{k: 3}}', got {text!r}")
    return value


def _check_strategies(names: list[str], options: dict) -> int:
    """``rlcurate strategies NAME --check``: :func:`rlcurate.contract.check_strategy` on each name (with
    ``options``), one line per strategy and its notes; exit 1 when one fails (what broke, in one line)."""
    from rlcurate.contract import check_strategy
    from rlcurate.curation.registry import build_curator, validate_strategy
    from rlcurate.errors import UserError

    failed = 0
    for name in names:
        validate_strategy(name, options)  # a misspelt option: one line, before any run
        if options:  # a value of --options the strategy refuses (a UserError from the build): one line, not FAILED
            try:
                build_curator(name, **options)
            except UserError:
                raise
            except Exception:  # noqa: BLE001 (the strategy's own failure: the contract's check reports it)
                pass
        try:
            report = check_strategy(name, **options)
        except AssertionError as exc:
            failed += 1
            print(f"{name}: FAILED: {exc}")
            continue
        print(f"{name}: keeps the contract ({', '.join(report['checks'])}; composed {len(report['composed'])} ways"
              + (f", {len(report['refused'])} refused with a reason" if report["refused"] else "")
              + (f"; not in the simulated world: {', '.join(report['not_in_sim'])}" if report["not_in_sim"] else "")
              + ")")
        for note in report["notes"]:
            print(f"  note: {note}")
    return 1 if failed else 0


def _delegate(module: str):
    def run(argv: list[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(argv) or 0)
    return run


COMMANDS = {
    "train": _train,
    "audit": _delegate("rlcurate.audit.cli"),
    "warmstart": _delegate("rlcurate.models.warmstart"),
    "serve": _delegate("rlcurate.rollout.server"),
    "runs": _delegate("rlcurate.experiments"),
    "conditions": _delegate("rlcurate.conditions"),
    "advise": _delegate("rlcurate.advise"),
    "compare": _delegate("rlcurate.compare"),
    "plan": _delegate("rlcurate.plan"),
    "dryrun": _delegate("rlcurate.dryrun"),
    "strategies": _strategies,
}

OPTIONS_OF_COMMANDS = {
    "replay": "runs --suite SUITE --replay STEPS",
    "summarize": "audit --summarize DIR",
    "summarise": "audit --summarize DIR",
    "sweep": "compare --suite SUITE --sweep",
    "list": "runs --suite SUITE --list",
}
"""Words a user may take for commands that are options of one: the unknown-command line names the option."""


def _close_progress_bars() -> None:
    """End any open tqdm bar's line, so that an error found mid-run starts a line of its own."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", ()) or ()):
        bar.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if argv[0] == "--version":
        from importlib.metadata import version

        print(f"rlcurate {version('rlcurate')}")
        return 0
    cmd, rest = argv[0], argv[1:]
    # transformers' "Loading weights" bar (and the Hub's) on every command is noise; HF_HUB_DISABLE_PROGRESS_BARS=0
    # brings them back (for a long download, say). The commands' own progress bars are not affected.
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "transformers" in sys.modules:  # read at its import
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    if cmd == "help":  # rlcurate help [COMMAND]
        if not rest:
            print(USAGE, end="")
            return 0
        cmd, rest = rest[0], ["--help"]
    if cmd not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        hint = (f" (it is an option: rlcurate {OPTIONS_OF_COMMANDS[cmd]})" if cmd in OPTIONS_OF_COMMANDS
                else f" (did you mean {close[0]!r}?)" if close else "")
        print(f"rlcurate: error: unknown command {cmd!r}{hint}; commands: {', '.join(COMMANDS)}; "
              "see 'rlcurate --help'", file=sys.stderr)
        return 2
    from rlcurate.errors import Stopped, UserError, one_line

    try:
        return COMMANDS[cmd](rest)
    except Stopped as exc:  # a signal, after the work was saved (rlcurate.errors)
        _close_progress_bars()
        print(f"rlcurate {cmd}: stopped: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except UserError as exc:  # a mistake in the input: one line, no traceback (rlcurate.errors)
        _close_progress_bars()
        print(f"rlcurate {cmd}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except PermissionError as exc:  # a file or folder the user named that this user may not read or write
        _close_progress_bars()
        what = f"{exc.filename}: permission denied" if exc.filename else one_line(exc)
        print(f"rlcurate {cmd}: error: {what}; give a path this user can read (or write)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlcurate {cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (rlcurate strategies | head): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
