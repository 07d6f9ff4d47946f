"""Rollout generation: ``rlcurate.rollout.TransformersEngine`` against a plain ``model.generate`` loop,
side by side in one process (appendix A1, *Benchmarks*).

Both sample the same prompts from the same model, ``n`` completions per prompt (a GRPO group), at
temperature 1 with top_k 0 and top_p 1, and both return texts (the ``generate`` loop decodes its
tokens; the engine decodes and also keeps every sampled token's log-probability):

* engine: ``engine.generate(prompts, n, SamplingParams(...), seed)``;
* generate: ``model.generate(**left_padded_prompts, do_sample=True, num_return_sequences=n, ...)``
  then ``batch_decode``.

``forced`` completions have exactly ``new_tokens`` tokens on both sides (EOS disabled for the engine,
``min_new_tokens`` for ``generate``), so both produce the same number of tokens. ``natural`` lets both
stop at EOS; it is only meaningful for a trained checkpoint (``--model``, default ``data/tiny/spread``
when it exists), whose answers end: then ``generate`` keeps decoding finished rows until the longest
is done, the engine drops them. Each cell is warmed up, then timed ``--repeats`` times with the two
interleaved; medians are reported.

    .venv/bin/python bench/bench_generate.py                 # writes data/bench/generate.json
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, interleaved, paired_ratio, summary, write_json  # noqa: E402


def load_model(model: str | None):
    """(model, tokenizer, description): ``model`` when given (``random``: the random tiny model), else
    data/tiny/spread when it exists, else the random tiny model."""
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, load_tiny

    path = Path(model) if model and model != "random" else REPO / "data" / "tiny" / "spread"
    if model != "random" and (path / "model.safetensors").is_file():
        m, tok = load_tiny(path)
        return m.eval(), tok, str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    if model and model != "random":
        raise SystemExit(f"--model {model}: no checkpoint there")
    return build_tiny_model(seed=0).eval(), build_tiny_tokenizer(), "random tiny Qwen2 (seed 0)"


def make_prompts(tok, k: int, rng: random.Random) -> list[str]:
    from rlcurate.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(levels=["add2", "add3", "sub3", "mul2x1"], n_train=64, n_test=1, seed=0)
    problems = task.problems("train")
    return [task.render(p, tok) for p in rng.sample(problems, k)]


def cell(model, tok, prompts, n, new_tokens, stopping, repeats):
    from rlcurate.rollout import SamplingParams, TransformersEngine

    eos = () if stopping == "forced" else None
    engine = TransformersEngine(model, tok, token_budget=10**7, eos_token_ids=eos)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                      num_return_sequences=n, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if stopping == "forced":
        gen_kwargs["min_new_tokens"] = new_tokens
    counts = {}

    def run_engine():
        out = engine.generate(prompts, n, params, seed=0)
        counts["engine_tokens"] = sum(len(c.token_ids) for g in out for c in g)
        return [c.text for g in out for c in g]

    def run_generate():
        with torch.inference_mode():
            out = model.generate(**enc, **gen_kwargs)
        comp = out[:, enc["input_ids"].shape[1]:]
        ends = (comp == tok.eos_token_id).int()
        lengths = torch.where(ends.any(1), ends.argmax(1) + 1, torch.full_like(ends[:, 0], comp.shape[1]))
        counts["generate_tokens"] = int(lengths.sum())
        counts["generate_decoded_positions"] = int(comp.numel())
        return tok.batch_decode(comp, skip_special_tokens=True)

    t_engine, t_gen = interleaved([run_engine, run_generate], repeats, warmup=1)
    rows = len(prompts) * n
    return {"prompts": len(prompts), "n": n, "completions": rows, "new_tokens": new_tokens, "stopping": stopping,
            "prompt_tokens_padded": int(enc["input_ids"].shape[1]),
            "engine": {**summary(t_engine), "tokens": counts["engine_tokens"],
                       "tokens_per_s": round(counts["engine_tokens"] / summary(t_engine)["median_s"], 1)},
            "generate": {**summary(t_gen), "tokens": counts["generate_tokens"],
                         "decoded_positions": counts["generate_decoded_positions"],
                         "tokens_per_s": round(counts["generate_tokens"] / summary(t_gen)["median_s"], 1)},
            "engine_over_generate": paired_ratio(t_engine, t_gen)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--stopping", nargs="+", choices=["forced", "natural"], default=["forced"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DATA / "generate.json"))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    t0 = time.perf_counter()
    model, tok, desc = load_model(args.model)
    record = {**header("rollout generation: TransformersEngine vs model.generate, same prompts and sampling, CPU",
                       threads=args.threads),
              "ratio": "engine time / generate time (< 1: the engine is faster)",
              "model": desc,
              "protocol": {"repeats": args.repeats, "warmup": 1, "statistic": "median; engine and generate "
                           "interleaved", "sampling": "temperature 1, top_k 0, top_p 1", "threads": args.threads},
              "results": []}
    print(f"{'stop':>7} {'prompts':>7} {'n':>3} {'new':>4} | {'engine tok/s':>12} {'generate tok/s':>14} | ratio")
    for stopping in args.stopping:
        for new in args.new_tokens:
            for k in args.prompts:
                prompts = make_prompts(tok, k, random.Random(k))
                row = cell(model, tok, prompts, args.n, new, stopping, args.repeats)
                record["results"].append(row)
                print(f"{stopping:>7} {k:>7} {args.n:>3} {new:>4} | {row['engine']['tokens_per_s']:>12.0f} "
                      f"{row['generate']['tokens_per_s']:>14.0f} | "
                      f"{row['engine_over_generate']['median_paired_ratio']:.3f}", flush=True)
    record["wall_s"] = round(time.perf_counter() - t0, 1)
    out = write_json(record, args.out)
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
