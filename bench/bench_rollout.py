"""Throughput of the rollout engine against a plain ``model.generate`` loop (chapter 4).

Both sample the same prompts from the same tiny model (random weights: speed does not depend on
them) at temperature 1 with top_k=0 and no early stop (EOS disabled), so both produce exactly
``batch * new_tokens`` tokens. Prompts come in groups of ``min(8, batch)`` samples, as in GRPO:
``TransformersEngine.generate(prompts, n=8)`` against ``model.generate(..., num_return_sequences=8)``.
Each cell is warmed up once, then timed ``--repeats`` times, engine and ``generate`` runs
interleaved; the median is reported. The engine's time
includes decoding the texts; ``generate``'s does not.

    .venv/bin/python bench/bench_rollout.py            # writes data/throughput/tiny_cpu.json

Timings on a shared machine are noisy: the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, count_params, tiny_config
from rlcurate.rollout import SamplingParams, TransformersEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def make_prompts(k: int, rng: random.Random) -> list[str]:
    return [f"<|user|>{rng.randint(10, 9999)}+{rng.randint(10, 9999)}=<|assistant|>" for _ in range(k)]


def median_times(fns, repeats: int) -> list[float]:
    """Median wall time of each function; runs are interleaved so that all see the same machine load."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--out", default=str(REPO / "data" / "throughput" / "tiny_cpu.json"))
    args = ap.parse_args(argv)

    model = build_tiny_model(seed=0).eval()
    tok = build_tiny_tokenizer()
    engine = TransformersEngine(model, tok, token_budget=10**7, eos_token_ids=())
    load_before, t_start = os.getloadavg(), time.perf_counter()
    rows = []
    print(f"{'threads':>7} {'batch':>5} {'new':>4} | {'engine tok/s':>12} {'generate tok/s':>14} | {'ratio':>5}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for new in args.new_tokens:
            for batch in args.batches:
                group = min(8, batch)
                prompts = make_prompts(batch // group, random.Random(batch))
                enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left",
                          add_special_tokens=False)
                params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new)
                gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                  min_new_tokens=new, num_return_sequences=group, pad_token_id=tok.pad_token_id)

                def run_engine():
                    out = engine.generate(prompts, group, params, seed=0)
                    assert sum(len(c.token_ids) for g in out for c in g) == batch * new

                def run_generate():
                    with torch.inference_mode():
                        out = model.generate(**enc, **gen_kwargs)
                    assert out.shape == (batch, enc["input_ids"].shape[1] + new)

                t_engine, t_gen = median_times([run_engine, run_generate], args.repeats)
                n_tok = batch * new
                row = dict(threads=threads, batch=batch, group_size=group,
                           prompt_tokens=int(enc["input_ids"].shape[1]),
                           new_tokens=new, engine_s=round(t_engine, 5), generate_s=round(t_gen, 5),
                           engine_tok_per_s=round(n_tok / t_engine, 1), generate_tok_per_s=round(n_tok / t_gen, 1),
                           engine_over_generate=round(t_gen / t_engine, 3))
                rows.append(row)
                print(f"{threads:>7} {batch:>5} {new:>4} | {row['engine_tok_per_s']:>12.0f} "
                      f"{row['generate_tok_per_s']:>14.0f} | {row['engine_over_generate']:>5.2f}", flush=True)
    env = provenance(device="cpu")
    record = {
        "what": "tokens per second, TransformersEngine vs model.generate, tiny Qwen2, CPU",
        "ratio": "engine_over_generate = generate time / engine time (> 1: the engine is faster)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": env["git_sha"],
        "machine": {"cpu": env["cpu"], "cores": env["cores"], "platform": env["platform"],
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
        "versions": {k: env[k] for k in ("python", "torch", "transformers")},
        "environment": env,
        "model": {"config": {k: v for k, v in tiny_config().to_dict().items()
                             if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                      "num_attention_heads", "num_key_value_heads")},
                  "n_params": count_params(model), "weights": "random, seed 0"},
        "protocol": {"repeats": args.repeats,
                     "statistic": "median after one warm-up; engine and generate runs interleaved",
                     "sampling": "temperature 1, top_k 0, top_p 1, EOS disabled, groups of min(8, batch)"},
        "wall_s": round(time.perf_counter() - t_start, 1),
        "results": rows,
    }
    busy = max(load_before[0], record["machine"]["load_avg_after"][0])
    if busy > 0.5 * (os.cpu_count() or 1):
        record["warning"] = (f"the machine was busy (1-min load average up to {busy:.1f} on {os.cpu_count()} cores): "
                             "timings with more than one thread per process are unreliable under contention")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
