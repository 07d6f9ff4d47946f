"""Where a captured decode step's time goes on a GPU (appendix A1, *Benchmarks*; issue #31): the sampler
(:func:`rlcurate.rollout.sampling.sample_next`, fp64 softmax and inverse CDF over the whole vocabulary)
against the same inverse CDF in fp32, and the one-token forward alone replayed as a CUDA graph, at several
batch sizes; plus two correctness checks on the device: the device uniforms equal the host's bit for bit,
and with fp32 weights (no autocast) the captured path returns the growing cache's completions.

    python3 bench/bench_decode_parts.py --arch Qwen/Qwen2.5-0.5B-Instruct --out data/bench/decode_parts_gpu.json
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, write_json  # noqa: E402
from bench_decode_cache import build_model  # noqa: E402
from bench_generate import make_prompts  # noqa: E402


def cuda_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / iters, 3)


def sample_fp32(logits, u):
    probs = torch.softmax(logits.float(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    return torch.searchsorted(cdf, (u.float()[:, None] * cdf[:, -1:]), right=True).clamp_(max=logits.shape[-1] - 1)


def profile_kernels(fn, calls: int = 5, top: int = 8) -> list[dict]:
    """The ``top`` CUDA kernels of ``fn`` by total device time, in ms per call, with calls per call."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:top]
    return [{"kernel": e.key[:120], "ms": round(e.device_time_total / 1000 / calls, 3), "per_call": e.count // calls}
            for e in events]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--context", type=int, default=192, help="KV columns the forward attends over")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the eager forward at the largest --rows: the largest CUDA kernels")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from rlcurate.rollout import SamplingParams, TransformersEngine
    from rlcurate.rollout.fixed_shape import KVBuffers, keys_as_int64, step_uniforms_device
    from rlcurate.rollout.sampling import row_keys, sample_next, step_uniforms

    dev = torch.device("cuda")
    model, tok, desc = build_model(args, dev)
    record = {**header("captured decode step: sampler vs forward, and device correctness checks"),
              "model": desc, "device": torch.cuda.get_device_name(dev), "context_columns": args.context, "rows": []}
    keys = row_keys(7, np.arange(1024), np.arange(1024) % 8)
    record["device_uniforms_equal_host"] = all(
        np.array_equal(step_uniforms(keys, t), step_uniforms_device(keys_as_int64(keys).to(dev),
                                                                   torch.tensor([t], device=dev)).cpu().numpy())
        for t in (0, 1, 100, 2**33 + 3))
    # correctness with fp32 weights, no autocast: the kernels differ only in shapes
    model = model.float().to(dev).eval()
    prompts = make_prompts(tok, 8, random.Random(0))
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    outs = {m: [c.token_ids for g in TransformersEngine(model, tok, eos_token_ids=(), decode=m).generate(
        prompts, 8, params, seed=0) for c in g] for m in ("dynamic", "captured")}
    record["fp32_identical_completions"] = sum(a == b for a, b in zip(outs["dynamic"], outs["captured"])) / 64
    record["fp32_identical_first_tokens"] = {
        k: sum(a[:k] == b[:k] for a, b in zip(outs["dynamic"], outs["captured"])) / 64 for k in (1, 4, 16)}
    print("uniforms equal:", record["device_uniforms_equal_host"], "fp32 identical:",
          record["fp32_identical_completions"], record["fp32_identical_first_tokens"], flush=True)

    model = model.to(torch.bfloat16)
    cfg = model.config
    V = model.get_input_embeddings().num_embeddings
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for R in args.rows:
        logits = torch.randn(R, V, device=dev) * 0.02
        u = torch.rand(R, dtype=torch.float64, device=dev)
        row = {"rows": R,
               "sampler_fp64_ms": cuda_ms(lambda: sample_next(logits, 1.0, 0, 1.0, u)),
               "sampler_fp32_ms": cuda_ms(lambda: sample_fp32(logits, u))}
        cache = KVBuffers.allocate(cfg.num_hidden_layers, R, cfg.num_key_value_heads, args.context, head_dim,
                                   head_dim, torch.bfloat16, dev)
        cache.write_at.fill_(args.context // 2)
        mask = torch.ones(R, 1, 1, args.context, dtype=torch.bool, device=dev)
        ids = torch.randint(0, V, (R, 1), device=dev)
        pos = torch.full((R, 1), args.context // 2, device=dev)

        def forward():
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, cache_position=cache.write_at, logits_to_keep=1).logits

        with torch.inference_mode():
            row["forward_eager_ms"] = cuda_ms(forward)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                forward()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                forward()
            row["forward_graph_ms"] = cuda_ms(g.replay)
            if args.profile and R == max(args.rows):
                record["profile"] = profile_kernels(forward)
        record["rows"].append(row)
        print(row, flush=True)
        del cache, g
        torch.cuda.empty_cache()
    write_json(record, args.out)


if __name__ == "__main__":
    main()
