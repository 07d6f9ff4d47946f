"""``rlcurate audit``: the variance audit from the command line (chapter 4).

Run a model N times on every sample of a data set, then summarise::

    rlcurate audit --model data/tiny/spread --task arithmetic --split test --runs 4 --limit 500 \\
        --out runs/audit_tiny
    rlcurate audit --model Qwen/Qwen2.5-0.5B-Instruct --task gsm8k --runs 8 --max-new-tokens 512 \\
        --out runs/audit_qwen
    rlcurate audit --backend openai --base-url http://127.0.0.1:8000/v1 --model-name tiny \\
        --model data/tiny/spread --task arithmetic --out runs/audit_http
    rlcurate audit --summarize runs/audit_tiny

Running the same command again resumes an interrupted audit; finished runs are never redone or lost.
The folder then holds ``runs.jsonl`` (one line per sample and run), ``config.json``, ``prompts.jsonl``,
``summary.json``, ``samples.jsonl``, ``mixed.jsonl`` (the mixed subset with its questions and answers,
for the ``prefilter`` strategy), ``variance.png`` and ``pass_rates.png``. The summary's verdict comes
first; it says when reward-function errors or the token limit, rather than the data, decide the
categories. Exit status: 0 done, 1 stopped early (everything finished is saved; rerun to resume),
2 bad input (nothing run), 130 interrupted, 143 terminated by SIGTERM (saved and recorded; rerun to
resume).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from rlcurate.errors import UserError, one_line

__all__ = ["build_parser", "main"]


def config_options():
    """The options of :class:`~rlcurate.audit.runner.AuditConfig` on the command line, built from its
    field docstrings (:class:`rlcurate.config_cli.ConfigOptions`)."""
    from rlcurate.audit.config import BACKENDS, ENDPOINTS, REWARD_ERROR_POLICIES, AuditConfig
    from rlcurate.config_cli import ConfigOptions, Option

    return ConfigOptions(AuditConfig, options={
        "task_kwargs": Option(note="with --model smollm2 the arithmetic task's style is chat unless given here"),
        "shuffle": Option(help="audit in the task's order, not a seeded random order"),
        "stop": Option(sep=None),
        "backend": Option(choices=BACKENDS),
        "endpoint": Option(choices=ENDPOINTS),
        "on_reward_error": Option(choices=REWARD_ERROR_POLICIES),
    })


def build_parser() -> argparse.ArgumentParser:
    from rlcurate._help import ArgumentParser, HelpFormatter, plain

    p = ArgumentParser(
        prog="rlcurate audit", description="The variance audit (chapter 4): N runs per sample, then a summary.",
        epilog=plain(__doc__.split("\n\n", 1)[1]), formatter_class=HelpFormatter)
    p.add_argument("--summarize", metavar="DIR", help="only (re)write the summary of the audit in DIR")
    p.add_argument("--out", metavar="DIR", help="audit folder (created; an existing audit there is resumed)")
    config_options().add_to(p)
    p.add_argument("--extra-runs", type=int, default=4, help="m of the hidden-signal estimate in the summary")
    p.add_argument("--group-size", type=int, default=None,
                   help="the group size training will use, for the summary's advice (default: --runs)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is often fastest for small models on a busy machine)")
    p.add_argument("--no-plots", action="store_true", help="do not draw the figures")
    p.add_argument("--max-chunks", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


SUMMARY_OPTIONS = {"summarize", "extra_runs", "group_size", "no_plots", "quiet", "threads"}
"""The options ``--summarize DIR`` reads; the others set how an audit runs."""


def _given(argv: Sequence[str] | None) -> set[str]:
    """The destinations of the options given on the command line (whatever their values)."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    given, _ = probe.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    return set(vars(given))


def _fail(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _summarize(parser: argparse.ArgumentParser, args: argparse.Namespace, folder: str, written: bool = False,
               runs: int = 2) -> int:
    """Write and print the summary of the audit in ``folder`` (exit status 0, or 2 naming what is wrong)."""
    from rlcurate.audit.config import AuditError
    from rlcurate.audit.report import format_summary, write_summary

    try:
        summary = write_summary(folder, extra_runs=args.extra_runs, plots=not args.no_plots, group_size=args.group_size)
    except AuditError as exc:
        return _fail(parser, str(exc))
    print(format_summary(summary))
    if written:
        print(f"written to {folder}")
        if runs >= 2:
            print(f"next: rlcurate advise {folder}  (what curation could save on this pool, and the group size; chapter 11)")
        else:
            print("next: audit again with --runs 8 (2 at the least) for rlcurate advise, which needs a pass rate per prompt")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlcurate audit`` and ``python -m rlcurate.audit.cli``."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rlcurate.audit.runner import AuditConfig, AuditError, AuditStopped, AuditTerminated, run_audit
    if args.extra_runs < 1:
        return _fail(parser, f"--extra-runs must be >= 1, got {args.extra_runs}")
    if args.group_size is not None and args.group_size < 2:
        return _fail(parser, f"--group-size must be >= 2 (a group of 1 is never mixed), got {args.group_size}")
    if args.summarize:
        if args.out or args.model:
            return _fail(parser, "--summarize DIR takes no --out or --model")
        running = sorted(_given(argv) - SUMMARY_OPTIONS)
        if running:
            return _fail(parser, f"--summarize DIR summarises the audit in DIR as it was run: "
                                 f"{', '.join('--' + d.replace('_', '-') for d in running)} set how an audit runs; "
                                 f"drop them, or audit again into another --out DIR")
        return _summarize(parser, args, args.summarize)

    if not args.out:
        return _fail(parser, "--out DIR is required (or --summarize DIR)")
    if not args.model:
        if args.backend == "openai" and args.model_name:
            args.model = args.model_name
        else:
            return _fail(parser, "--model is required (a checkpoint directory, 'smollm2' or a Hub id)")
    options = config_options()
    try:
        values = options.values(args)
    except UserError as exc:
        return _fail(parser, str(exc))
    from rlcurate.presets import task_kwargs_for

    values["task_kwargs"], note = task_kwargs_for(args.model, args.task, values["task_kwargs"])
    if note:
        print(f"{parser.prog}: {note}", file=sys.stderr)
    if args.threads is not None:
        if args.threads < 1:
            return _fail(parser, f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    try:
        config = AuditConfig(**values)
    except AuditError as exc:
        return _fail(parser, options.flag_message(exc))
    if config.backend == "transformers":  # a missing checkpoint path: one line, before the folder is written
        from rlcurate.models.hf import check_model_source

        try:
            check_model_source(config.model, flag="--model")
        except UserError as exc:
            return _fail(parser, str(exc))
    try:
        if config.runs == 1:
            print(f"{parser.prog}: warning: --runs 1 cannot tell mixed prompts from uniform ones (one run always "
                  "agrees with itself); the summary will give pass rates only. Use --runs 8 (2 at the least) for a verdict.",
                  file=sys.stderr)
        session = run_audit(config, args.out, progress=not args.quiet, max_chunks=args.max_chunks)
    except AuditError as exc:
        return _fail(parser, str(exc))
    except AuditStopped as exc:
        print(f"{parser.prog}: stopped: {one_line(exc)}", file=sys.stderr)
        return 1
    except AuditTerminated:
        print(f"{parser.prog}: terminated by SIGTERM; every finished batch is saved in {args.out} and the session "
              "is recorded; run the same command again to resume.", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; every finished batch is saved in {args.out}; run the same command "
              "again to resume.", file=sys.stderr)
        return 130
    except (ConnectionError, RuntimeError, OSError) as exc:
        print(f"{parser.prog}: stopped by {type(exc).__name__}: {one_line(exc)}; every finished batch is saved in "
              f"{args.out}; run the same command again to resume.", file=sys.stderr)
        return 1
    if not session["complete"]:
        print(f"audit paused after {session['chunks']} chunk(s); run the same command again to continue",
              file=sys.stderr)
    return _summarize(parser, args, args.out, written=True, runs=config.runs)


if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    from rlcurate.cli import main as _cli

    raise SystemExit(_cli(["audit", *sys.argv[1:]]))
