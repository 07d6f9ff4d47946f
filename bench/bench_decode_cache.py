"""The rollout engine's decode paths side by side in one process (appendix A1, *Benchmarks*; issue #31):
the growing KV cache (``decode="dynamic"``, the default), the fixed-shape loop run eagerly (``static``),
recorded as a CUDA graph per bucket of rows (``captured``), and compiled then recorded (``compiled``),
and a plain ``model.generate`` loop (``--generate``).

Every path samples the same prompts, ``n`` completions each, exactly ``new_tokens`` tokens (EOS off), at
temperature 1; the engine paths draw the same uniforms, so they return the same tokens up to float
rounding between kernels (the share of identical completions is reported). For each batch size of
``--rows`` and each weight setting of ``--weights`` (``fp32-autocast``: the trainer's fp32 weights under
bf16 autocast; ``bf16``: a bf16 copy; ``fp32``), the paths run in interleaved rounds after
one untimed warm-up round (in which graphs are recorded and steps compiled: its time is reported).
ms per step is the median wall time of a call divided by ``new_tokens`` (the prefill included).

    .venv/bin/python bench/bench_decode_cache.py                                  # CPU, the tiny model
    python3 bench/bench_decode_cache.py --device cuda --arch Qwen/Qwen2.5-0.5B-Instruct \
        --rows 64 256 1024 --weights fp32-autocast bf16 --modes dynamic captured \
        --new-tokens 128 --repeats 3 --out data/bench/decode_captured_gpu.json          # a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, interleaved, paired_ratio, summary, write_json  # noqa: E402
from bench_generate import load_model, make_prompts  # noqa: E402


def build_model(args, dev):
    if not args.arch:
        return load_model(args.model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcurate.dryrun import tokenizer_dir
    from rlcurate.models.architectures import hf_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(args.arch), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.padding_side = "left"
    if not tok.chat_template:  # the stored tokenizer files carry none: Qwen's ChatML turns
        tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return model, tok, f"{args.arch} (random weights)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint dir (default: data/tiny/spread)")
    ap.add_argument("--arch", default=None, help="a Hub id of rlcurate.models.architectures: random weights instead")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[64], help="rows per batch (prompts x n)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--weights", nargs="+", default=["fp32"], choices=["fp32", "fp32-autocast", "bf16"])
    ap.add_argument("--modes", nargs="+", default=["dynamic", "static", "captured", "compiled"])
    ap.add_argument("--generate", action="store_true", help="also time model.generate")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DATA / "decode_cache_cpu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from rlcurate.rollout import SamplingParams, TransformersEngine

    hf_logging.set_verbosity_error()
    dev = torch.device(args.device)
    base, tok, desc = build_model(args, dev)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens)
    record = {**header("rollout decode paths: dynamic vs static vs captured vs compiled (vs model.generate)",
                       threads=args.threads),
              "model": desc, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "new_tokens": args.new_tokens, "samples_per_prompt": args.n, "cells": []}
    for weights in args.weights:
        model = (base.to(torch.bfloat16) if weights == "bf16" else base.float()).to(dev).eval()
        autocast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if weights == "fp32-autocast" \
            else contextlib.nullcontext
        for rows in args.rows:
            prompts = make_prompts(tok, max(1, rows // args.n), random.Random(rows))
            engines = {m: TransformersEngine(model, tok, token_budget=10**9, eos_token_ids=(), decode=m)
                       for m in args.modes}
            tokens, fns, names, errors = {}, [], [], {}

            def runner(name):
                def run():
                    with autocast():
                        out = engines[name].generate(prompts, args.n, params, seed=0)
                    tokens[name] = [c.token_ids for g in out for c in g]
                return run

            first = {}
            for m in args.modes:  # the untimed first call: graphs recorded, steps compiled
                t0 = time.perf_counter()
                try:
                    runner(m)()
                    fns.append(runner(m))
                    names.append(m)
                    first[m] = round(time.perf_counter() - t0, 2)
                except Exception as e:  # a path that fails here is reported, the others still timed
                    errors[m] = f"{type(e).__name__}: {e}"[:2000]
                    traceback.print_exc()
            if args.generate:
                enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left",
                          add_special_tokens=False).to(dev)
                kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                          min_new_tokens=args.new_tokens, num_return_sequences=args.n, pad_token_id=tok.pad_token_id)

                def run_generate():
                    with torch.inference_mode(), autocast():
                        model.generate(**enc, **kw)
                fns.append(run_generate)
                names.append("generate")
            times = interleaved(fns, args.repeats, warmup=0)
            n_tok = len(prompts) * args.n * args.new_tokens
            ref = names[0]
            cell = {"weights": weights, "rows": len(prompts) * args.n, "first_call_s": first, "errors": errors,
                    "graphs_recorded": {m: e.fixed.graphs_recorded for m, e in engines.items() if e.fixed},
                    "identical_completions_vs_" + ref: {
                        m: round(sum(a == b for a, b in zip(tokens[m], tokens[ref])) / len(tokens[ref]), 4)
                        for m in names if m in tokens and m != ref},
                    "results": {m: {**summary(t), "ms_per_step": round(1000 * summary(t)["median_s"] / args.new_tokens, 3),
                                    "tokens_per_s": round(n_tok / summary(t)["median_s"], 1)}
                                for m, t in zip(names, times)},
                    "over_" + ref: {m: paired_ratio(t, times[0]) for m, t in zip(names[1:], times[1:])}}
            record["cells"].append(cell)
            for m in names:
                r = cell["results"][m]
                print(f"{weights:>13} rows {cell['rows']:>5} {m:>9}: {r['ms_per_step']:>8.2f} ms/step "
                      f"{r['tokens_per_s']:>10.0f} tokens/s", flush=True)
            print(f"   identical vs {ref}: {cell['identical_completions_vs_' + ref]}; first call {first}; "
                  f"errors {list(errors)}", flush=True)
            write_json(record, args.out)  # after every cell: a later failure loses nothing
            del engines
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return record


if __name__ == "__main__":
    main()
