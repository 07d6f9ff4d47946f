"""The prompts' common prefix encoded once per batch against each prompt encoded whole, one GRPO step
of ``rlcurate.train.Trainer`` each, side by side in one process (appendix A3).

SmolLM2's chat arithmetic prompt (the task of appendix A3) is 129 tokens, of which the first 120 (the
system turn and three few-shot turns) are the same for every question. Two trainers start from the
same checkpoint with the same seed, so they draw the same prompts and sample the same tokens (up to
float rounding); one encodes the common prefix once per generation batch and training micro-batch
(:mod:`rlcurate.models.prefill`), the other with every prompt (``MIN_SHARED_PREFIX`` raised out of
reach during its steps; each distinct prompt is still encoded once per group in both). They step
alternately; after ``--warmup`` steps each, the medians of generation, training and the whole step,
and the median of the per-step ratios of CPU time (a paired statistic: the two steps ran back to back
on the same batch) are reported.

    .venv/bin/python bench/bench_prefix_share.py --model smollm2 --repeats 8 --warmup 1 \
        --out data/bench/prefix_share_smollm2.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, paired_ratio, summary, write_json  # noqa: E402
from bench_trl_step import build_rlcurate, checkpoint_dir, checkpoint_label, make_task  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="checkpoint dir or 'smollm2' (default)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DATA / "prefix_share_smollm2.json"))
    args = ap.parse_args(argv)
    # what build_rlcurate reads: the task's own reward and natural stopping, the config's micro-batches
    args.stopping, args.reward, args.micro_batch_tokens = "natural", "task", None

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from rlcurate.models import prefill

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    shared_min = prefill.MIN_SHARED_PREFIX
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = checkpoint_dir(args.model, tmp)
        if args.model == "smollm2":  # the task of appendix A3: configs/smollm2_uniform.yaml's levels
            from rlcurate.tasks.arithmetic import ArithmeticTask
            from rlcurate.train.config import read_yaml

            kwargs = read_yaml(REPO / "configs" / "smollm2_uniform.yaml", what="config")["task_kwargs"]
            task, style = ArithmeticTask(**{**kwargs, "seed": args.seed}), kwargs["style"]
        else:
            task, style = make_task("task", n_train=64, seed=args.seed, style="tiny"), "tiny"
        steps = {"shared": build_rlcurate(ckpt, task, args, tmp / "shared")[1],
                 "whole": build_rlcurate(ckpt, task, args, tmp / "whole")[1]}
        head = header("one GRPO step with the prompts' common prefix encoded once vs with every prompt, CPU",
                      threads=torch.get_num_threads())
        recs = {k: [] for k in steps}
        wall = {k: [] for k in steps}
        cpu = {k: [] for k in steps}
        for i in range(args.warmup + args.repeats):
            for name in (("shared", "whole") if i % 2 == 0 else ("whole", "shared")):
                prefill.MIN_SHARED_PREFIX = shared_min if name == "shared" else 10**9
                t0, c0 = time.perf_counter(), time.process_time()
                rec = steps[name]()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                recs[name].append(rec)
            print(f"step {i}: " + ", ".join(f"{k} {wall[k][-1]:.1f} s" for k in steps), flush=True)
        prefill.MIN_SHARED_PREFIX = shared_min

    W = args.warmup
    same = [a["generated_tokens"] == b["generated_tokens"] and a["reward_mean"] == b["reward_mean"]
            for a, b in zip(recs["shared"], recs["whole"])]
    record = {**head,
              "ratio": "shared / whole, CPU time of the step (< 1: sharing the prefix is faster); median over "
                       "steps of the per-step ratio (the two steps run back to back on the same batch)",
              "config": {"checkpoint": checkpoint_label(ckpt), "prompt_style": style,
                         "prompts_per_step": args.prompts, "group_size": args.group,
                         "max_new_tokens": args.new_tokens, "stopping": "natural (EOS)", "reward": "task",
                         "task": "configs/smollm2_uniform.yaml" if args.model == "smollm2" else "arithmetic, tiny",
                         "lr": args.lr, "threads": args.threads, "warmup_steps": W,
                         "timed_steps": args.repeats, "seed": args.seed,
                         "min_shared_prefix": shared_min},
              "identical_steps": int(sum(same[W:])),
              "identical_steps_note": "steps whose generated-token count and mean reward agree on both sides: "
                                      "the same prompts are drawn, but float rounding between the two layouts "
                                      "moves the weights apart and can flip a sampled token"}
    for name in steps:
        r = recs[name][W:]
        record[name] = {"step": summary(wall[name][W:]), "step_cpu": summary(cpu[name][W:]),
                        "generate": summary([x["time/generate"] for x in r]),
                        "update": summary([x["time/train"] for x in r]),
                        "samples_nonzero_adv_median": float(np.median([x["samples_nonzero_adv"] for x in r]))}
    record["shared_over_whole_cpu_time"] = paired_ratio(cpu["shared"][W:], cpu["whole"][W:])
    record["shared_over_whole_generate"] = paired_ratio([x["time/generate"] for x in recs["shared"][W:]],
                                                        [x["time/generate"] for x in recs["whole"][W:]])
    record["shared_over_whole_update"] = paired_ratio([x["time/train"] for x in recs["shared"][W:]],
                                                      [x["time/train"] for x in recs["whole"][W:]])
    record["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = write_json(record, args.out)
    for name in steps:
        print(f"{name:<7} step {record[name]['step']['median_s']:6.2f} s (generate "
              f"{record[name]['generate']['median_s']:5.2f} s, update {record[name]['update']['median_s']:5.2f} s)")
    for part in ("cpu_time", "generate", "update"):
        print(f"shared / whole, {part}: median paired ratio "
              f"{record[f'shared_over_whole_{part}']['median_paired_ratio']:.3f}")
    print(f"identical steps on both sides: {record['identical_steps']} of {args.repeats}; wrote {out}")
    return record


if __name__ == "__main__":
    main()
