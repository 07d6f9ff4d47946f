"""Audit throughput: samples (completions) per second of ``rlcurate.audit.run_audit`` against the bare
rollout engine on the same prompts, side by side in one process (appendix A1, *Benchmarks*).

``run_audit`` renders each chunk of prompts, generates ``runs`` completions per prompt with the
engine, scores every completion with the task's verifier, and appends one JSON line per completion to
``runs.jsonl`` (fsync'ed, so that an interrupted audit resumes). The baseline does only the
generation and the scoring, in memory. Their ratio is the cost of the audit's bookkeeping. Both use
the same engine, prompts, seeds and sampling (temperature 1, top_k 0, natural stopping at EOS);
repeats are interleaved after a warm-up and each audit run writes to a fresh folder.

    .venv/bin/python bench/bench_audit.py                 # writes data/bench/audit.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, interleaved, paired_ratio, summary, write_json  # noqa: E402
from bench_generate import load_model  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint (default data/tiny/spread, else a random tiny model)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--chunk-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DATA / "audit.json"))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from rlcurate.audit import AuditConfig, audit_order, chunk_seed, run_audit
    from rlcurate.rollout import TransformersEngine
    from rlcurate.tasks.arithmetic import ArithmeticTask

    hf_logging.set_verbosity_error()
    t_start = time.perf_counter()
    model, tok, desc = load_model(args.model)
    task = ArithmeticTask(levels=["add2", "add3", "sub3", "mul2x1"], n_train=4, n_test=args.prompts // 4 + 1, seed=0)
    engine = TransformersEngine(model, tok)
    config = AuditConfig(model="(in memory)", task="arithmetic", split="test", runs=args.runs, limit=args.prompts,
                         max_new_tokens=args.max_new_tokens, chunk_size=args.chunk_size, temperature=1.0, top_k=0)
    problems = task.problems("test")
    order = audit_order(len(problems), config)[: args.prompts]
    subset = [problems[i] for i in order]
    params = config.sampling_params()
    tmp = Path(tempfile.mkdtemp(prefix="bench_audit_"))
    stats = {}

    def audit():
        out = tmp / "audit"
        shutil.rmtree(out, ignore_errors=True)
        session = run_audit(config, out, engine=engine, tokenizer=tok, task=task)
        assert session["complete"] and session["new_runs"] == args.prompts * args.runs
        stats["audit_tokens"] = session["generated_tokens"]

    def bare():
        tokens = 0
        C = args.chunk_size
        for c in range(-(-len(subset) // C)):
            chunk = subset[c * C:(c + 1) * C]
            prompts = [task.render(p, tok) for p in chunk]
            groups = engine.generate(prompts, args.runs, params, seed=chunk_seed(config.seed, c))
            for p, g in zip(chunk, groups):
                for comp in g:
                    task.reward(p, comp.text)
                    tokens += comp.num_tokens
        stats["bare_tokens"] = tokens

    try:
        t_audit, t_bare = interleaved([audit, bare], args.repeats, warmup=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    samples = args.prompts * args.runs
    record = {**header("audit throughput: rlcurate.audit.run_audit vs the bare engine (generate + score), CPU",
                       threads=args.threads),
              "ratio": "audit time / bare time (> 1: the audit's bookkeeping costs that much)",
              "model": desc,
              "config": {"prompts": args.prompts, "runs": args.runs, "samples": samples,
                         "max_new_tokens": args.max_new_tokens, "chunk_size": args.chunk_size,
                         "sampling": "temperature 1, top_k 0, top_p 1, stop at EOS", "repeats": args.repeats,
                         "threads": args.threads},
              "audit": {**summary(t_audit), "samples_per_s": round(samples / summary(t_audit)["median_s"], 1),
                        "tokens": stats["audit_tokens"]},
              "bare": {**summary(t_bare), "samples_per_s": round(samples / summary(t_bare)["median_s"], 1),
                       "tokens": stats["bare_tokens"]},
              "audit_over_bare": paired_ratio(t_audit, t_bare),
              "wall_s": round(time.perf_counter() - t_start, 1)}
    out = write_json(record, args.out)
    print(f"audit {record['audit']['samples_per_s']:.0f} samples/s, bare engine {record['bare']['samples_per_s']:.0f} "
          f"samples/s; audit / bare time {record['audit_over_bare']['median_paired_ratio']:.3f}")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
