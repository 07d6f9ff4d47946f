"""Activation memory of one training micro-batch, per completion token (appendix A1, *Memory*).

A model of a GPU configuration's real architecture (random weights, fp32 master weights, bf16 autocast)
scores a micro-batch with the trainer's own ``forward_logprobs`` and ``policy_loss`` (prompts shared
across each group of G completions, as the trainer does) at two completion lengths; the difference of
the memory held for the backward pass, divided by the difference in completion tokens, is the
per-token activation memory that ``rlcurate plan`` predicts (``rlcurate.policy.memory.activation_bytes_per_token``).

Memory held for the backward pass is read two ways:

* ``saved``: the bytes of the distinct tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``),
  parameters left out; works on any device;
* ``allocated`` (CUDA only): ``torch.cuda.memory_allocated()`` after the forward pass minus before it,
  and the peak during forward and backward (``max_memory_allocated``) minus before it.

    python bench/bench_memory.py --device cuda --out data/bench/memory_cuda.json          # on a GPU
    python bench/bench_memory.py --device cpu --lengths 32 96 --out data/bench/memory_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, write_json  # noqa: E402


def make_samples(vocab: int, rows: int, group: int, prompt_len: int, completion_len: int, seed: int = 0):
    from rlcurate.policy.batching import TrainSample
    from rlcurate.train.loss import aggregation_coefficients

    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(rows // group):
        prompt = torch.randint(1, vocab, (prompt_len,), generator=gen).tolist()
        for _ in range(group):
            comp = torch.randint(1, vocab, (completion_len,), generator=gen).tolist()
            samples.append(TrainSample(prompt, comp, float(torch.randn(1, generator=gen))))
    aggregation_coefficients(samples, "token-mean", completion_len)
    return samples


def measure(model, samples, device, backward: bool) -> dict:
    """Bytes saved for backward (distinct storages, parameters excluded) and, on CUDA, allocated."""
    from rlcurate.policy.scoring import forward_logprobs
    from rlcurate.train.loss import policy_loss

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() not in seen:
            seen[s.data_ptr()] = s.nbytes()
        return t

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, mask, _ = forward_logprobs(model, samples, 1.0, 0, with_entropy=True)
        loss, _ = policy_loss(logp, mask, samples, 0.2, 0.28, 0.0)
    out = {"saved_bytes": int(sum(seen.values()))}
    if cuda:
        torch.cuda.synchronize()
        out["allocated_after_forward"] = torch.cuda.memory_allocated() - before
    if backward:
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
            out["peak_forward_backward"] = torch.cuda.max_memory_allocated() - before
    out["seconds"] = round(time.perf_counter() - t0, 3)
    del loss, logp, mask
    model.zero_grad(set_to_none=False)  # gradients stay allocated: the next peak holds activations only
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="+", default=["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-Math-1.5B"])
    ap.add_argument("--rows", type=int, default=8, help="completions in the micro-batch")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--lengths", type=int, nargs=2, default=[256, 1024], help="two completion lengths")
    ap.add_argument("--layers", type=int, help="keep only the first N layers (CPU memory)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--no-backward", action="store_true", help="forward only (saved bytes need no backward)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rlcurate.models.architectures import hf_config
    from rlcurate.policy.memory import activation_bytes_per_token

    hf_logging.set_verbosity_error()
    rows = []
    for name in args.models:
        changes = {"num_hidden_layers": args.layers} if args.layers else {}
        config = hf_config(name, **changes)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(device)  # fp32 master weights
        model.train()
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        backward = not args.no_backward
        if backward:  # allocate the gradients once, outside the measured peaks
            measure(model, make_samples(config.vocab_size, args.group, args.group, 8, 8), device, True)
        points = []
        for L in args.lengths:
            m = measure(model, make_samples(config.vocab_size, args.rows, args.group, args.prompt_len, L, seed=L),
                        device, backward)
            m.update(completion_len=L, completion_tokens=args.rows * L)
            points.append(m)
            print(f"{name} L={L}: {m}", flush=True)
        dt = points[1]["completion_tokens"] - points[0]["completion_tokens"]
        per_token = {k: (points[1][k] - points[0][k]) / dt for k in points[0]
                     if k not in ("seconds", "completion_len", "completion_tokens")}
        predicted = activation_bytes_per_token(config, gradient_checkpointing=args.gradient_checkpointing)
        row = {"model": name, "layers": config.num_hidden_layers, "rows": args.rows, "group": args.group,
               "prompt_len": args.prompt_len, "gradient_checkpointing": args.gradient_checkpointing,
               "points": points, "per_completion_token": per_token, "predicted_per_token": predicted,
               "saved_over_predicted": per_token["saved_bytes"] / predicted}
        rows.append(row)
        print(f"{name}: per completion token {({k: round(v / 2**20, 3) for k, v in per_token.items()})} MiB; "
              f"predicted {predicted / 2**20:.3f} MiB", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    record = {**header("Activation memory per completion token of a training micro-batch (bf16 autocast, fp32 "
                       "master weights, shared prompts, chunked output layer)"),
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else str(device), "results": rows}
    out = write_json(record, args.out or DATA / f"memory_{device.type}.json")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
