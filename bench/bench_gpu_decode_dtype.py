"""What the trainer's decode loop loses by sampling from its fp32 master weights (appendix A1, *Benchmarks*).

The trainer generates with the model it trains: fp32 weights under bf16 autocast, which casts every
weight again at each decode step. This script times ``rlcurate.rollout.TransformersEngine`` on the
Qwen2.5-0.5B architecture (random weights) both ways, interleaved, at a few batch sizes: (a) the fp32
model under autocast, as the trainer does; (b) a bf16 copy, as an inference engine would (it costs 2
bytes per parameter and a copy after every optimizer step). Forced length, same prompts and seeds.

    python bench/bench_gpu_decode_dtype.py --out data/bench/decode_dtype_h100.json     # on a CUDA machine
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, header, summary, write_json  # noqa: E402
from bench_gpu_throughput import _IdTokenizer, qwen_config  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a scaled-down config (CPU dry run of the script)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from transformers import Qwen2ForCausalLM

    from rlcurate.rollout import SamplingParams, TransformersEngine

    device = torch.device(args.device)
    config = qwen_config(args.small)
    torch.manual_seed(0)
    fp32 = Qwen2ForCausalLM(config).to(device)
    bf16 = Qwen2ForCausalLM(config).to(device, dtype=torch.bfloat16)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in fp32.state_dict().items()})
    cuda = device.type == "cuda"
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens)
    engines = {"fp32 + autocast (trainer)": TransformersEngine(fp32, _IdTokenizer(), token_budget=10**9,
                                                               eos_token_ids=(), pad_token_id=0),
               "bf16 copy": TransformersEngine(bf16, _IdTokenizer(), token_budget=10**9, eos_token_ids=(), pad_token_id=0)}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in args.batches:
        prompts = [p.tolist() for p in torch.randint(1, config.vocab_size, (B // 8, args.prompt_len), generator=gen)]
        times = {name: [] for name in engines}
        for r in range(args.repeats + 1):  # the first round warms up
            for name, engine in engines.items():
                ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda and name.startswith("fp32")
                       else contextlib.nullcontext())
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with ctx:
                    engine.generate(prompts, 8, params, seed=r)
                if cuda:
                    torch.cuda.synchronize()
                if r:
                    times[name].append(time.perf_counter() - t0)
        row = {"batch": B, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
               **{name: {**summary(t), "ms_per_step": round(1000 * summary(t)["median_s"] / args.new_tokens, 2)}
                  for name, t in times.items()}}
        rows.append(row)
        print(f"B={B}: " + ", ".join(f"{n} {row[n]['ms_per_step']} ms/step" for n in engines), flush=True)
    record = {**header("Decode with the trainer's fp32 weights under autocast vs a bf16 copy (Qwen2.5-0.5B "
                       "architecture, random weights)"),
              "device": torch.cuda.get_device_name(0) if cuda else str(device), "rows": rows}
    out = write_json(record, args.out or DATA / "decode_dtype.json")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
