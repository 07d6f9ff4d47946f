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
import json
import logging
import sys
from typing import Sequence

from rlcurate.errors import one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from rlcurate._help import ArgumentParser, HelpFormatter, plain

    p = ArgumentParser(
        prog="rlcurate audit", description="The variance audit (chapter 4): N runs per sample, then a summary.",
        epilog=plain(__doc__.split("\n\n", 1)[1]), formatter_class=HelpFormatter)
    p.add_argument("--summarize", metavar="DIR", help="only (re)write the summary of the audit in DIR")
    p.add_argument("--out", metavar="DIR", help="audit folder (created; an existing audit there is resumed)")
    p.add_argument("--model", help="checkpoint directory, 'smollm2' or a Hub id (openai backend: the tokenizer)")
    p.add_argument("--task", default="arithmetic", help="task name (arithmetic, gsm8k, math500, ...)")
    p.add_argument("--task-kwargs", default="{}", metavar="JSON",
                   help='task options as a JSON object, e.g. \'{"style": "chat", "n_test": 8}\'; with '
                        "--model smollm2 the arithmetic task's style is chat unless given here")
    p.add_argument("--split", default="test", help="which split of the task to audit")
    p.add_argument("--runs", type=int, default=4, help="runs per sample, N (default 4)")
    p.add_argument("--limit", type=int, default=None, help="audit this many samples (default all)")
    p.add_argument("--no-shuffle", action="store_true", help="audit in the task's order, not a seeded random order")
    p.add_argument("--subset-seed", type=int, default=0, help="seed of the audit order")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k truncation (0: off)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="most tokens per completion")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chunk-size", type=int, default=32,
                   help="samples per chunk (the unit of the random streams); generated and saved in batches that "
                        "fit --token-budget")
    p.add_argument("--success-threshold", type=float, default=1.0,
                   help="score that counts as a success, in (0, 1] (rewards lie in [0, 1])")
    p.add_argument("--backend", default="transformers", choices=["transformers", "openai"],
                   help="a local model, or an OpenAI-compatible server at --base-url")
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model-name", help="served model name (openai backend; default --model)")
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"],
                   help="openai backend: /v1/completions with prompts rendered by --model's tokenizer, or "
                        "/v1/chat/completions with the task's chat turns (the server applies its template)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, ...")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on a GPU, float32 on the CPU), float32, ...")
    p.add_argument("--token-budget", type=int, default=16384,
                   help="tokens (rows x (prompt + max new tokens)) per generation call and per save; lower it to "
                        "see and save progress more often with a large model")
    p.add_argument("--on-reward-error", default="zero", choices=["zero", "stop"],
                   help="a reward function that raises: score 0 and go on (default), or stop cleanly")
    p.add_argument("--extra-runs", type=int, default=4, help="m of the hidden-signal estimate in the summary")
    p.add_argument("--group-size", type=int, default=None,
                   help="the group size training will use, for the summary's advice (default: --runs)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is often fastest for small models on a busy machine)")
    p.add_argument("--no-plots", action="store_true", help="do not draw the figures")
    p.add_argument("--max-chunks", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _fail(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _as_flag(parser: argparse.ArgumentParser, message: str) -> str:
    """``success_threshold must ...`` -> ``--success-threshold must ...`` where the field is a flag."""
    field, _, rest = message.partition(" ")
    flag = "--" + field.replace("_", "-")
    return f"{flag} {rest}" if rest.startswith("must") and flag in parser._option_string_actions else message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlcurate audit`` and ``python -m rlcurate.audit.cli``."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rlcurate.audit.runner import AuditConfig, AuditError, AuditStopped, AuditTerminated, run_audit
    from rlcurate.audit.summary import format_summary, write_summary

    if args.extra_runs < 1:
        return _fail(parser, f"--extra-runs must be >= 1, got {args.extra_runs}")
    if args.group_size is not None and args.group_size < 2:
        return _fail(parser, f"--group-size must be >= 2 (a group of 1 is never mixed), got {args.group_size}")
    if args.summarize:
        if args.out or args.model:
            return _fail(parser, "--summarize DIR takes no --out or --model")
        try:
            summary = write_summary(args.summarize, extra_runs=args.extra_runs, plots=not args.no_plots,
                                    group_size=args.group_size)
        except AuditError as exc:
            return _fail(parser, str(exc))
        print(format_summary(summary))
        return 0

    if not args.out:
        return _fail(parser, "--out DIR is required (or --summarize DIR)")
    if not args.model:
        if args.backend == "openai" and args.model_name:
            args.model = args.model_name
        else:
            return _fail(parser, "--model is required (a checkpoint directory, 'smollm2' or a Hub id)")
    try:
        task_kwargs = json.loads(args.task_kwargs)
    except ValueError as exc:
        return _fail(parser, f"--task-kwargs is not valid JSON ({exc}): {args.task_kwargs!r}")
    if not isinstance(task_kwargs, dict):
        return _fail(parser, f"--task-kwargs must be a JSON object, got {args.task_kwargs!r}")
    from rlcurate.presets import task_kwargs_for

    task_kwargs, note = task_kwargs_for(args.model, args.task, task_kwargs)
    if note:
        print(f"{parser.prog}: {note}", file=sys.stderr)
    if args.threads is not None:
        if args.threads < 1:
            return _fail(parser, f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    try:
        config = AuditConfig(
            model=args.model, task=args.task, task_kwargs=task_kwargs, split=args.split, runs=args.runs,
            limit=args.limit, shuffle=not args.no_shuffle, subset_seed=args.subset_seed, seed=args.seed,
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
            stop=tuple(args.stop), chunk_size=args.chunk_size, success_threshold=args.success_threshold,
            backend=args.backend, base_url=args.base_url, model_name=args.model_name, endpoint=args.endpoint,
            device=args.device,
            dtype=args.dtype, token_budget=args.token_budget, on_reward_error=args.on_reward_error)
    except AuditError as exc:
        return _fail(parser, _as_flag(parser, str(exc)))
    try:
        if config.runs == 1:
            print(f"{parser.prog}: warning: --runs 1 cannot tell mixed prompts from uniform ones (one run always "
                  "agrees with itself); the summary will give pass rates only. Use --runs 2 or more for a verdict.",
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
    try:
        summary = write_summary(args.out, extra_runs=args.extra_runs, plots=not args.no_plots,
                                group_size=args.group_size)
    except AuditError as exc:
        return _fail(parser, str(exc))
    print(format_summary(summary))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    from rlcurate.cli import main as _cli

    raise SystemExit(_cli(["audit", *sys.argv[1:]]))
