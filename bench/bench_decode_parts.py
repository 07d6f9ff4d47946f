"""Where a captured decode step's time goes on a GPU (appendix A1, *Benchmarks*; issue #31): the sampler
(``sampler_fp64_ms``: :func:`rlcurate.rollout.sampling.sample_next_tensors`, fp64 softmax and inverse CDF
over the whole vocabulary) against the fused Triton kernel (``sampler_fused_ms``, and whether it drew the
same tokens), the tensor path's two softmaxes alone and the same inverse CDF in fp32, and the one-token
forward alone, eager and replayed as a CUDA graph, with ``transformers``' SDPA attention (keys and values
expanded to every query head) and with the decode step's own
:func:`rlcurate.rollout.fixed_shape.decode_attention` (grouped heads kept), at several batch sizes; plus
two correctness checks on the device: the device uniforms equal the host's bit for bit, and with fp32
weights (no autocast) the captured path returns the growing cache's completions.

    python3 bench/bench_decode_parts.py --arch Qwen/Qwen2.5-0.5B-Instruct --profile --out data/bench/decode_parts_gpu.json

``--device cpu`` rehearses the script on a CPU (wall-clock timings, no graphs, a CPU profile): a check that
it runs before device time is spent on it, not a measurement.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, write_json  # noqa: E402
from bench_decode_cache import build_model  # noqa: E402
from bench_generate import make_prompts  # noqa: E402


def cuda_ms(fn, iters=20, warmup=3):
    if not torch.cuda.is_available():  # a CPU rehearsal: wall time
        for _ in range(warmup):
            fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return round((time.perf_counter() - t0) * 1000 / iters, 3)
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

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        sync()
    total = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events = sorted(prof.key_averages(), key=lambda e: -total(e))[:top]
    return [{"kernel": e.key[:120], "ms": round(total(e) / 1000 / calls, 3), "per_call": e.count // calls}
            for e in events]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--context", type=int, default=192, help="KV columns the forward attends over")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the forward at the largest --rows, with each attention: the largest kernels")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only rehearses the script")
    ap.add_argument("--correctness-rows", type=int, default=64, help="completions of the fp32 correctness check")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from rlcurate.rollout import SamplingParams, TransformersEngine
    from rlcurate.rollout.fixed_shape import (DECODE_ATTENTION, KVBuffers, _attention, keys_as_int64,
                                              step_uniforms_device)
    from rlcurate.rollout.sampling import row_keys, sample_next_tensors, step_uniforms

    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    fused_sample = None
    if on_gpu:
        from rlcurate.rollout import fused_sampler
        if fused_sampler.triton is not None:
            fused_sample = fused_sampler.sample_rows
    model, tok, desc = build_model(args, dev)
    record = {**header("captured decode step: sampler vs forward, and device correctness checks"),
              "model": desc, "device": torch.cuda.get_device_name(dev) if on_gpu else "cpu (a rehearsal)",
              "context_columns": args.context, "rows": []}
    keys = row_keys(7, np.arange(1024), np.arange(1024) % 8)
    record["device_uniforms_equal_host"] = all(
        np.array_equal(step_uniforms(keys, t), step_uniforms_device(keys_as_int64(keys).to(dev),
                                                                   torch.tensor([t], device=dev)).cpu().numpy())
        for t in (0, 1, 100, 2**33 + 3))
    # correctness with fp32 weights, no autocast: the kernels differ only in shapes
    model = model.float().to(dev).eval()
    n_check = max(1, args.correctness_rows // 8)
    prompts = make_prompts(tok, n_check, random.Random(0))
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    outs = {m: [c.token_ids for g in TransformersEngine(model, tok, eos_token_ids=(), decode=m).generate(
        prompts, 8, params, seed=0) for c in g] for m in ("dynamic", "captured")}
    pairs = list(zip(outs["dynamic"], outs["captured"]))
    record["fp32_identical_completions"] = sum(a == b for a, b in pairs) / len(pairs)
    record["fp32_identical_first_tokens"] = {k: sum(a[:k] == b[:k] for a, b in pairs) / len(pairs) for k in (1, 4, 16)}
    print("uniforms equal:", record["device_uniforms_equal_host"], "fp32 identical:",
          record["fp32_identical_completions"], record["fp32_identical_first_tokens"], flush=True)
    write_json(record, args.out)

    model = model.to(torch.bfloat16)
    cfg = model.config
    V = model.get_input_embeddings().num_embeddings
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for R in args.rows:
        logits = torch.randn(R, V, device=dev) * 0.02
        u = torch.rand(R, dtype=torch.float64, device=dev)
        row = {"rows": R,
               "sampler_fp64_ms": cuda_ms(lambda: sample_next_tensors(logits, 1.0, 0, 1.0, u)),
               "sampler_fused_ms": cuda_ms(lambda: fused_sample(logits, 1.0, u)) if fused_sample else None,
               "sampler_fused_same_tokens": bool(torch.equal(fused_sample(logits, 1.0, u)[0],
                                                             sample_next_tensors(logits, 1.0, 0, 1.0, u)[0]))
               if fused_sample else None,
               "softmax_fp64_ms": cuda_ms(lambda: torch.softmax(logits.double(), dim=-1)),
               "log_softmax_fp32_ms": cuda_ms(lambda: torch.log_softmax(logits, dim=-1)),
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

        def forward_grouped():  # the decode step's attention (DecodeStep.step)
            with _attention(model.config, DECODE_ATTENTION):
                return forward()

        with torch.inference_mode():
            for name, fn in (("", forward), ("_decode_attention", forward_grouped)):
                row[f"forward_eager{name}_ms"] = cuda_ms(fn)
                if on_gpu:
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        fn()
                    torch.cuda.current_stream().wait_stream(s)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fn()
                    row[f"forward_graph{name}_ms"] = cuda_ms(g.replay)
                    del g
                if args.profile and R == max(args.rows):
                    record.setdefault("profile", {})[f"forward{name or '_sdpa'}"] = profile_kernels(fn)
        record["rows"].append(row)
        print(row, flush=True)
        write_json(record, args.out)  # after every batch size: a later failure or timeout loses nothing
        del cache
        if on_gpu:
            torch.cuda.empty_cache()
    write_json(record, args.out)


if __name__ == "__main__":
    main()
