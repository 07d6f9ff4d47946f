"""GPU throughput of rollouts and training against the hardware's limits (appendix A1, *Benchmarks*).

A model with the Qwen2.5-0.5B architecture (its published config, random weights: throughput does not
depend on the weights, and nothing is downloaded) is

* decoded with ``rlcurate.rollout.TransformersEngine`` and with ``model.generate`` at several batch
  sizes (forced length: every completion has exactly ``--new-tokens`` tokens), in bf16;
* trained with the GRPO trainer's own forward and loss (``rlcurate.train.loss``: fp32 weights, bf16
  autocast, backward, fused AdamW) at several batch sizes;

and each measured rate is set against its limit:

* decode: each step reads every weight once and the whole KV cache of the batch, so
  ``tokens/s <= batch * bandwidth / (weight_bytes + batch * context * kv_bytes_per_token)``, with the
  mean context ``prompt + new_tokens / 2`` and the bandwidth measured by a device-to-device copy
  (the nominal figure of the GPU is recorded too when known);
* training: ``tokens/s <= matmul_flops_per_s / (6 * params)`` (forward 2, backward 4 FLOPs per
  parameter and token; attention's own FLOPs are left out, small at these lengths), with the bf16
  matmul rate measured on the device.

    python bench/bench_gpu_throughput.py --out data/bench/gpu_h100.json      # on a CUDA machine
    python bench/bench_gpu_throughput.py --device cpu --small --out /tmp/x.json  # a CPU dry run

The limit formulas are tested on the CPU (``tests/test_bench.py``); the GPU numbers were not measured
in the session that wrote this script (no GPU was lent to it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, summary, write_json  # noqa: E402

from rlcurate.models.architectures import architecture, hf_config, param_count  # noqa: E402
from rlcurate.plan import kv_bytes_per_token as plan_kv_bytes_per_token  # noqa: E402

MODEL_ID = "Qwen/Qwen2.5-0.5B"  # its architecture: rlcurate.models.architectures
QWEN25_05B_PARAMS = 494_032_768  # the published count (tied embeddings counted once)

# Nominal memory bandwidth (bytes/s) and dense bf16 tensor-core rate (FLOP/s) from the vendors' sheets.
NOMINAL = {
    "H100 80GB HBM3": {"bandwidth": 3.35e12, "bf16_flops": 989e12},  # SXM
    "H100 PCIe": {"bandwidth": 2.0e12, "bf16_flops": 756e12},
    "H200": {"bandwidth": 4.8e12, "bf16_flops": 989e12},
    "A100-SXM4-80GB": {"bandwidth": 2.039e12, "bf16_flops": 312e12},
}


# ---------------------------------------------------------------------------------------------- limits
def qwen_config(small: bool = False):
    """The Qwen2.5-0.5B ``Qwen2Config``; ``small`` scales it down (same shape of model) for CPU dry runs."""
    small_fields = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    return hf_config(MODEL_ID, **(small_fields if small else {}))


count_params = param_count            # the planner's counts (rlcurate.plan and its architectures), under A1's names
kv_bytes_per_token = plan_kv_bytes_per_token


def decode_step_bytes(weight_bytes: float, kv_per_token: float, batch: int, context: float) -> float:
    """Bytes one decode step must read: every weight once plus the KV cache of every row."""
    return weight_bytes + batch * context * kv_per_token


def decode_limit_tokens_per_s(weight_bytes: float, kv_per_token: float, batch: int, context: float,
                              bandwidth: float) -> float:
    """Memory-bound ceiling of decoding: ``batch`` tokens per step, a step no faster than its bytes / bandwidth."""
    return batch * bandwidth / decode_step_bytes(weight_bytes, kv_per_token, batch, context)


def train_limit_tokens_per_s(n_params: int, flops_per_s: float) -> float:
    """Compute-bound ceiling of training: 6 FLOPs per parameter and token (2 forward, 4 backward)."""
    return flops_per_s / (6.0 * n_params)


# ---------------------------------------------------------------------------------------------- measurements
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def measure_bandwidth(device, mib: int, repeats: int) -> float:
    """Device copy bandwidth in bytes/s (read + write of ``mib`` MiB)."""
    x = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = summary(timed(lambda: y.copy_(x), device, repeats))["median_s"]
    return 2 * x.numel() / t


def measure_matmul(device, n: int, repeats: int, dtype) -> float:
    """Dense matmul rate in FLOP/s for an n x n x n product."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = summary(timed(lambda: a @ b, device, repeats))["median_s"]
    return 2 * n**3 / t


class _IdTokenizer:
    """Enough of a tokenizer for the engine on token-id prompts of a random-weight model."""

    eos_token_id = None
    pad_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=False):
        return [""] * len(ids)


def rollout_rows(model, config, device, batches, prompt_len, new_tokens, repeats, weight_bytes, bandwidth,
                 dtype_bytes=2):
    from rlcurate.rollout import SamplingParams, TransformersEngine

    engine = TransformersEngine(model, _IdTokenizer(), token_budget=10**9, eos_token_ids=(), pad_token_id=0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens)
    kv = kv_bytes_per_token(config, dtype_bytes)
    context = prompt_len + new_tokens / 2
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in batches:
        n = 8 if B >= 8 else 1
        prompts = torch.randint(1, config.vocab_size, (B // n, prompt_len), generator=gen)
        ids = [p.tolist() for p in prompts]

        def run_engine():
            engine.generate(ids, n, params, seed=0)

        enc = prompts.to(device)

        def run_generate():
            with torch.inference_mode():
                model.generate(input_ids=enc, attention_mask=torch.ones_like(enc), do_sample=True, temperature=1.0,
                               top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               num_return_sequences=n, pad_token_id=0)

        te = summary(timed(run_engine, device, repeats))
        tg = summary(timed(run_generate, device, repeats))
        limit = decode_limit_tokens_per_s(weight_bytes, kv, B, context, bandwidth)
        tok = B * new_tokens
        row = {"batch": B, "group": n, "prompt_len": prompt_len, "new_tokens": new_tokens,
               "engine": {**te, "tokens_per_s": round(tok / te["median_s"], 1)},
               "generate": {**tg, "tokens_per_s": round(tok / tg["median_s"], 1)},
               "limit_tokens_per_s": round(limit, 1),
               "engine_share_of_limit": round(tok / te["median_s"] / limit, 4),
               "generate_share_of_limit": round(tok / tg["median_s"] / limit, 4)}
        rows.append(row)
        print(f"rollout B={B:>4}: engine {row['engine']['tokens_per_s']:>10.0f} tok/s, generate "
              f"{row['generate']['tokens_per_s']:>10.0f} tok/s, limit {limit:>10.0f} tok/s", flush=True)
    return rows


def training_rows(model, config, device, batches, seq_len, completion_len, repeats, n_params, flops):
    from rlcurate.train.loss import TrainSample, aggregation_coefficients, forward_logprobs, policy_loss

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type in ("cuda", "cpu"))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    gen = torch.Generator().manual_seed(1)
    rows = []
    for B in batches:
        samples = []
        for _ in range(B):  # distinct prompts: every token is processed (no prompt sharing)
            ids = torch.randint(1, config.vocab_size, (seq_len,), generator=gen).tolist()
            samples.append(TrainSample(ids[: seq_len - completion_len], ids[seq_len - completion_len:],
                                       float(torch.randn(1, generator=gen))))
        aggregation_coefficients(samples, "token-mean", completion_len)

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast:
                logp, mask, _ = forward_logprobs(model, samples, 1.0, 0)
                loss, _ = policy_loss(logp, mask, samples, 0.2, 0.28, 0.0)
            loss.backward()
            opt.step()

        t = summary(timed(step, device, repeats))
        tokens = B * seq_len
        limit = train_limit_tokens_per_s(n_params, flops)
        row = {"batch": B, "seq_len": seq_len, "completion_len": completion_len, "tokens": tokens, **t,
               "tokens_per_s": round(tokens / t["median_s"], 1), "limit_tokens_per_s": round(limit, 1),
               "share_of_limit": round(tokens / t["median_s"] / limit, 4)}
        rows.append(row)
        print(f"train   B={B:>4}: {row['tokens_per_s']:>10.0f} tok/s, limit {limit:>10.0f} tok/s "
              f"({row['share_of_limit']:.1%})", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON path (default data/bench/gpu_<device>.json)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a scaled-down config (CPU dry run of the script)")
    ap.add_argument("--rollout-batches", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--train-batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; run on a GPU machine (or --device cpu --small for a dry run)")
    from transformers import Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    t_start = time.perf_counter()
    config = qwen_config(args.small)
    n_params = count_params(config)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else None
    nominal = next((v for k, v in NOMINAL.items() if gpu and k in gpu), None)
    bandwidth = measure_bandwidth(device, 1024 if device.type == "cuda" else 64, max(args.repeats, 5))
    mm_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    flops = measure_matmul(device, 8192 if device.type == "cuda" else 512, max(args.repeats, 5), mm_dtype)
    print(f"{gpu or device}: copy bandwidth {bandwidth / 1e9:.0f} GB/s, matmul {flops / 1e12:.1f} TFLOP/s; "
          f"{n_params / 1e6:.1f}M parameters", flush=True)

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device)
    infer = Qwen2ForCausalLM(config).to(device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    infer.load_state_dict({k: v.to(infer.dtype) for k, v in model.state_dict().items()})
    infer.eval()
    weight_bytes = n_params * (2 if device.type == "cuda" else 4)
    rollout = rollout_rows(infer, config, device, args.rollout_batches, args.prompt_len, args.new_tokens,
                           args.repeats, weight_bytes, bandwidth, 2 if device.type == "cuda" else 4)
    del infer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model.train()
    training = training_rows(model, config, device, args.train_batches, args.seq_len, args.seq_len // 2,
                             args.repeats, n_params, flops)
    record = {**header("GPU throughput: Qwen2.5-0.5B architecture (random weights), rollout and training "
                       "against memory-bandwidth and matmul limits"),
              "model": {"config": architecture(MODEL_ID) if not args.small else "small dry-run config",
                        "n_params": n_params, "weights": "random (seed 0)"},
              "device": {"name": gpu or str(device), "copy_bandwidth_bytes_per_s": bandwidth,
                         "matmul_flops_per_s": flops, "matmul_dtype": str(mm_dtype), "nominal": nominal},
              "limits": {"decode": "batch * bandwidth / (weight_bytes + batch * (prompt + new/2) * kv_bytes_per_token)",
                         "train": "matmul_flops_per_s / (6 * params)",
                         "kv_bytes_per_token": kv_bytes_per_token(config, 2 if device.type == "cuda" else 4),
                         "weight_bytes": weight_bytes},
              "rollout": rollout, "training": training,
              "wall_s": round(time.perf_counter() - t_start, 1)}
    name = (gpu or str(device)).lower().replace(" ", "_").replace("/", "_")
    out = write_json(record, args.out or DATA / f"gpu_{name}.json")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
