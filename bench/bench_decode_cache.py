"""The rollout engine's decode paths side by side in one process (appendix A1, *Benchmarks*): the growing
KV cache (``cache="dynamic"``, the default), a preallocated one (``cache="static"``), the static one with
the one-token forward compiled (``compile_decode=True``: ``torch.compile(mode="reduce-overhead")``, CUDA
graphs on a GPU), and a plain ``model.generate`` loop.

Every path samples the same prompts, ``n`` completions each, exactly ``new_tokens`` tokens (EOS off), at
temperature 1; the three engine paths draw the same uniforms, so they must return the same tokens (checked).
Compilation happens in an untimed warm-up (its time is reported). Medians of ``--repeats`` interleaved rounds.

    .venv/bin/python bench/bench_decode_cache.py                                  # CPU, the tiny model
    .venv/bin/python bench/bench_decode_cache.py --device cuda --arch Qwen/Qwen2.5-0.5B-Instruct \
        --prompts 32 --n 8 --new-tokens 256 --out data/bench/decode_cache_gpu.json   # a GPU
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, interleaved, paired_ratio, summary, write_json  # noqa: E402
from bench_generate import load_model, make_prompts  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint dir (default: data/tiny/spread)")
    ap.add_argument("--arch", default=None, help="a Hub id of rlcurate.models.architectures: random weights instead")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
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
    if args.arch:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlcurate.dryrun import tokenizer_dir
        from rlcurate.models.architectures import hf_config

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(hf_config(args.arch), dtype=torch.bfloat16 if dev.type == "cuda"
                                                 else torch.float32)
        tok, desc = AutoTokenizer.from_pretrained(tokenizer_dir()), f"{args.arch} (random weights)"
        tok.padding_side = "left"
    else:
        model, tok, desc = load_model(args.model)
    model = model.to(dev).eval()
    prompts = make_prompts(tok, args.prompts, random.Random(args.prompts))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens)
    engines = {"dynamic": TransformersEngine(model, tok, token_budget=10**8, eos_token_ids=()),
               "static": TransformersEngine(model, tok, token_budget=10**8, eos_token_ids=(), cache="static"),
               "compiled": TransformersEngine(model, tok, token_budget=10**8, eos_token_ids=(), cache="static",
                                              compile_decode=True)}
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(dev)
    gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                      min_new_tokens=args.new_tokens, num_return_sequences=args.n, pad_token_id=tok.pad_token_id)
    tokens = {}

    def runner(name):
        def run():
            out = engines[name].generate(prompts, args.n, params, seed=0)
            tokens[name] = [c.token_ids for g in out for c in g]
        return run

    def run_generate():
        with torch.inference_mode():
            model.generate(**enc, **gen_kwargs)

    t0 = time.perf_counter()
    runner("compiled")()  # compiles: untimed
    compile_s = time.perf_counter() - t0
    names = ["dynamic", "static", "compiled", "generate"]
    times = interleaved([runner("dynamic"), runner("static"), runner("compiled"), run_generate], args.repeats, warmup=1)
    same = {n: tokens[n] == tokens["dynamic"] for n in ("static", "compiled")}
    n_tok = args.prompts * args.n * args.new_tokens
    record = {**header("rollout decode paths: dynamic vs static vs compiled KV cache vs model.generate",
                       threads=args.threads),
              "model": desc, "device": str(dev),
              "batch": {"prompts": args.prompts, "n": args.n, "new_tokens": args.new_tokens, "tokens": n_tok},
              "compile_seconds": round(compile_s, 1), "same_tokens_as_dynamic": same,
              "results": {n: {**summary(t), "tokens_per_s": round(n_tok / summary(t)["median_s"], 1)}
                          for n, t in zip(names, times)},
              "over_dynamic": {n: paired_ratio(t, times[0]) for n, t in zip(names[1:], times[1:])}}
    for n in names:
        print(f"{n:>9}: {record['results'][n]['tokens_per_s']:>9.0f} tokens/s", flush=True)
    print(f"same tokens as dynamic: {same}; compile {compile_s:.0f} s")
    write_json(record, args.out)
    return record


if __name__ == "__main__":
    main()
