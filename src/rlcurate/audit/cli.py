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
The folder then holds ``runs.jsonl`` (one line per sample and run), ``config.json``, ``summary.json``,
``samples.jsonl``, ``mixed.jsonl`` (the mixed subset, for the ``prefilter`` strategy),
``variance.png`` and ``pass_rates.png``. Exit status: 0 done, 1 stopped early (everything finished is
saved; rerun to resume), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlcurate audit", description="The variance audit (chapter 4): N runs per sample, then a summary.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summarize", metavar="DIR", help="only (re)write the summary of the audit in DIR")
    p.add_argument("--out", metavar="DIR", help="audit folder (created; an existing audit there is resumed)")
    p.add_argument("--model", help="checkpoint directory, 'smollm2' or a Hub id (openai backend: the tokenizer)")
    p.add_argument("--task", default="arithmetic", help="task name (arithmetic, gsm8k, math500, ...)")
    p.add_argument("--task-kwargs", default="{}", metavar="JSON",
                   help='task options as a JSON object, e.g. \'{"style": "chat", "n_test": 8}\'')
    p.add_argument("--split", default="test")
    p.add_argument("--runs", type=int, default=4, help="runs per sample, N (default 4)")
    p.add_argument("--limit", type=int, default=None, help="audit this many samples (default all)")
    p.add_argument("--no-shuffle", action="store_true", help="audit in the task's order, not a seeded random order")
    p.add_argument("--subset-seed", type=int, default=0, help="seed of the audit order")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chunk-size", type=int, default=32, help="samples per generation call and per write")
    p.add_argument("--success-threshold", type=float, default=1.0, help="score that counts as a success")
    p.add_argument("--backend", default="transformers", choices=["transformers", "openai"])
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model-name", help="served model name (openai backend; default --model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--token-budget", type=int, default=16384, help="tokens per generation batch (local engine)")
    p.add_argument("--on-reward-error", default="zero", choices=["zero", "stop"],
                   help="a reward function that raises: score 0 and go on (default), or stop cleanly")
    p.add_argument("--extra-runs", type=int, default=4, help="m of the hidden-signal estimate in the summary")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is often fastest for small models on a busy machine)")
    p.add_argument("--no-plots", action="store_true", help="do not draw the figures")
    p.add_argument("--max-chunks", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _fail(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlcurate audit`` and ``python -m rlcurate.audit.cli``."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rlcurate.audit.runner import AuditConfig, AuditError, AuditStopped, run_audit
    from rlcurate.audit.summary import format_summary, write_summary

    if args.extra_runs < 1:
        return _fail(parser, f"--extra-runs must be >= 1, got {args.extra_runs}")
    if args.summarize:
        if args.out or args.model:
            return _fail(parser, "--summarize DIR takes no --out or --model")
        try:
            summary = write_summary(args.summarize, extra_runs=args.extra_runs, plots=not args.no_plots)
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
            backend=args.backend, base_url=args.base_url, model_name=args.model_name, device=args.device,
            dtype=args.dtype, token_budget=args.token_budget, on_reward_error=args.on_reward_error)
        session = run_audit(config, args.out, progress=not args.quiet, max_chunks=args.max_chunks)
    except AuditError as exc:
        return _fail(parser, str(exc))
    except AuditStopped as exc:
        print(f"{parser.prog}: stopped: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; every finished chunk is saved in {args.out}; run the same command "
              "again to resume.", file=sys.stderr)
        return 130
    except (ConnectionError, RuntimeError, OSError) as exc:
        print(f"{parser.prog}: stopped by {type(exc).__name__}: {exc}\nEvery finished chunk is saved in "
              f"{args.out}; run the same command again to resume.", file=sys.stderr)
        return 1
    if not session["complete"]:
        print(f"audit paused after {session['chunks']} chunk(s); run the same command again to continue",
              file=sys.stderr)
    summary = write_summary(args.out, extra_runs=args.extra_runs, plots=not args.no_plots)
    print(format_summary(summary))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
