"""``rlcurate plan``: the memory and time of a training configuration on one GPU, predicted from its
architecture, and a verdict (appendix A1, *Memory* and *Planning a GPU run*).

    rlcurate plan --config configs/gpu_grpo_qwen25_05b_gsm8k.yaml --gpu h100-80gb
    rlcurate plan --suite configs/suites/gpu_end_to_end_gsm8k.yaml

**Memory.** The peak is the static part plus the larger of the training and the generation phase:

    static      weights 4N + gradients 4N + AdamW moments 8N (fp32) + a reference model 4N when
                kl_coef > 0 (a copy of the fp32 policy) + the bf16 weight copies autocast keeps 2N
    training    activations per completion token x completion tokens of the largest micro-batch
                + the prompt pass + each row's copy of its prompt's keys and values + a backward
                transient (fitted on the H100: 1.5 GiB + c x one layer's activations per token)
    generation  the KV cache of gen_token_budget tokens (bf16 under autocast: KV_DTYPE_BYTES) + the sampler's
                fp32 logits; with decode captured or compiled these are static instead, held for the
                whole run: the persistent cache of the largest batch's bucket of rows by the longest
                prompt plus max_new_tokens, and each recorded bucket's step state
                (:mod:`rlcurate.rollout.fixed_shape`)

The largest micro-batch packs ``micro_batch_tokens // (shortest prompt + max_new_tokens)`` rows of
``max_new_tokens`` each (:func:`rlcurate.policy.batching.plan_micro_batches`): short prompts let more
completions into a micro-batch, and completions hold nearly all of its activations.

Activations per completion token: :mod:`rlcurate.policy.memory` (its docstring counts every tensor).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcurate.models.architectures import param_count
from rlcurate.policy.memory import (ACTIVATION_MARGIN, activation_bytes_per_token, head_bytes_per_token,
                                    layer_bytes_per_token, layer_dims, micro_batch_tokens_for)

__all__ = ["activation_bytes_per_token", "layer_bytes_per_token", "head_bytes_per_token", "GPUS",
           "PROMPT_TOKENS", "Plan", "plan_config", "main"]

GiB = 2**30


# ------------------------------------------------------------------------------------------ the machine
# Memory a training process can use (the card's memory less ~1.5 GiB of CUDA context and allocator
# slack), the copy bandwidth and dense bf16 matmul rate as measured on the H100 by
# bench/bench_gpu_throughput.py (data/bench/gpu_h100.json), on the H200 as measured on this project's device
# machines (a device-to-device copy and an 8192^3 bf16 matmul), the vendor's figures for the others. Only the
# memory and the training time use them: the decode rates below are measured ones, not scaled by card.
GPUS: dict[str, dict[str, float]] = {
    "h100-80gb": {"memory": 78.0 * GiB, "bandwidth": 2.90e12, "bf16_flops": 774e12},
    "h200": {"memory": 138.0 * GiB, "bandwidth": 4.3e12, "bf16_flops": 790e12},
    "a100-80gb": {"memory": 78.0 * GiB, "bandwidth": 2.0e12, "bf16_flops": 312e12},
    "a100-40gb": {"memory": 38.5 * GiB, "bandwidth": 1.5e12, "bf16_flops": 312e12},
    "l4-24gb": {"memory": 22.5 * GiB, "bandwidth": 0.3e12, "bf16_flops": 121e12},
}

# Prompt tokens (shortest, mean, longest) of each task's training split as the trainer renders them
# with the Qwen2.5 chat template and tokenizer (measured on ../shared/data; tests/test_plan.py
# re-measures them).
PROMPT_TOKENS: dict[str, tuple[int, int, int]] = {
    "gsm8k": (61, 108, 243), "math": (35, 110, 1364), "math_l3to5": (35, 110, 1364),
    "countdown": (103, 108, 111),
}


# Time of one decode step: a part per layer plus a part per row, by decode path (appendix A1, *Benchmarks*).
# Eager (decode "dynamic" or "static"), from the H100: the loop is bound by per-step overhead, not bandwidth:
# 44 ms per step at 256 rows for the 24-layer 0.5B model in the dry run (data/bench/dryrun_h100_grpo_05b.json;
# 22.5 s for 511 steps), of which 0.0113 ms per row (the least-squares slope of bench_gpu_throughput's four engine
# points, 8-1,024 rows, data/bench/gpu_h100.json; those steps rise only 1.6x while the rows grow 16x).
# Captured (decode "captured"; "compiled" charged the same, an upper bound: its step was 3.7 against 5.7 ms at
# 256 rows, data/bench/decode_compiled_h200.json, and it has not run in the trainer), from the H200: the trainer's
# dry run generated 256 rows x 512 steps in 4.16 s with the trained weights under autocast and 3.58 s with the bf16
# rollout copy (data/bench/dryrun_h200_grpo_05b_decode.json), of which 0.0088 ms per row (the captured step's
# slope from 64 to 1,024 rows, data/bench/decode_captured_h200.json); a captured step decodes its bucket's rows.
# The per-layer part is scaled with depth; the intercepts were measured at 512 new tokens (the slopes at 256 and
# 128), and a captured step attends its whole cache, so a larger cache (longer prompts, hints, max_new_tokens)
# costs more per step than charged. Neither rate is scaled by card (--gpu changes memory and training time).
# Training runs at the bench's steady-state share of the matmul limit, 0.258 of 774 TFLOP/s at 6 FLOPs per
# parameter and position.
DECODE_S_PER_ROW = {"eager": 1.13e-5, "captured": 8.8e-6}
DECODE_S_PER_LAYER = {"eager": (0.044 - 256 * DECODE_S_PER_ROW["eager"]) / 24,
                      "captured": (4.16 / 512 - 256 * DECODE_S_PER_ROW["captured"]) / 24,
                      "captured_bf16_copy": (3.58 / 512 - 256 * DECODE_S_PER_ROW["captured"]) / 24}
TRAIN_MATMUL_SHARE = 0.258
DECODE_RATE_SOURCE = {
    "eager": "decode at the eager loop's rate, measured on an H100 (with the eager code of 2026-11-24)",
    "captured": "decode at the captured step's rate, measured on an H200 (likely optimistic on an H100, whose memory "
                "bandwidth is lower; no captured step has run on one)"}
"""Where each decode rate was measured, said with every plan (appendix A1): neither is scaled by card."""


def decode_rates(config) -> tuple[float, float, bool]:
    """(seconds per layer, seconds per row, whether the rows are bucketed) of one decode step of ``config``."""
    if config.decode in ("captured", "compiled"):
        per_layer = DECODE_S_PER_LAYER["captured_bf16_copy" if config.rollout_weights == "bf16" else "captured"]
        return per_layer, DECODE_S_PER_ROW["captured"], True
    return DECODE_S_PER_LAYER["eager"], DECODE_S_PER_ROW["eager"], False


KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "fp32": 4}
"""Bytes of one KV-cache element on a GPU for the trainer's ``dtype``: the engine keeps its cache in the
dtype attention computes in (:func:`rlcurate.rollout.fixed_shape.kv_cache_dtype`), autocast's bf16 under
``auto`` and ``bf16``, fp32 under ``fp32`` (tests/test_rollout_static.py checks the two agree)."""


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """Keys and values of one token over all layers: 2 x layers x kv_heads x head_dim x dtype_bytes."""
    k = layer_dims(config)[2]
    return 2 * config.num_hidden_layers * k * dtype_bytes


@dataclass
class Plan:
    """The predicted memory (bytes) and time (seconds) of one configuration on one GPU."""

    config: str
    gpu: str
    params: int
    memory: dict[str, float]
    peak_bytes: float
    capacity_bytes: float
    seconds: dict[str, float]
    advice: list[str] = field(default_factory=list)
    assumptions: dict[str, Any] = field(default_factory=dict)
    disk: tuple[float, float, str] = (0.0, 0.0, "")
    """``(bytes, checkpoint bytes, why)``: the most disk the run adds to ``out_dir`` at once, one checkpoint (fp32
    weights and AdamW's two moments) and why (:meth:`~rlcurate.train.config.TrainConfig.out_dir_need`, the check
    the trainer makes before its first step)."""

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def gpu_hours(self) -> float:
        return self.seconds["total"] / 3600

    def describe(self) -> str:
        m = {k: f"{v / GiB:.1f}" for k, v in self.memory.items()}
        lines = [f"{self.config} on {self.gpu}: {self.params / 1e9:.2f}B parameters; peak {self.peak_bytes / GiB:.1f} GiB "
                 f"of {self.capacity_bytes / GiB:.1f} GiB: {'fits' if self.fits else 'DOES NOT FIT'}",
                 "  GiB: " + ", ".join(f"{k} {v}" for k, v in m.items()),
                 f"  time: {self.seconds['generate_per_step']:.0f} s generating + {self.seconds['train_per_step']:.1f} s "
                 f"training per step, {self.seconds['eval_each']:.0f} s per evaluation; {self.gpu_hours:.1f} GPU-hours "
                 f"in all ({self.assumptions['rollouts']:,} rollouts, {self.assumptions['steps']} steps, "
                 f"{self.assumptions['evaluations']} evaluations)"]
        lines.append(f"  rates: {self.assumptions['decode_rate']}; training at {TRAIN_MATMUL_SHARE:.0%} of the card's "
                     f"bf16 matmul peak (the H100 bench's steady share)")
        if self.disk[0]:
            lines.append(f"  disk: {self.disk[0] / GiB:.1f} GiB for out_dir at its fullest (checkpoints of "
                         f"{self.disk[1] / GiB:.1f} GiB, fp32 weights and AdamW's two moments: {self.disk[2]})")
        lines += [f"  turn: {a}" for a in self.advice]
        return "\n".join(lines)


def plan_config(config, gpu: str = "h100-80gb", prompt_tokens: tuple[int, int, int] | None = None,
                arch_config=None, name: str | None = None) -> Plan:
    """The :class:`Plan` of a :class:`~rlcurate.train.config.TrainConfig` (module docstring).
    ``arch_config`` is the transformers config of the model (default: from
    :mod:`rlcurate.models.architectures` by ``config.model``); ``prompt_tokens`` is (shortest, mean, longest)
    (default :data:`PROMPT_TOKENS` of the task)."""
    from rlcurate.models.architectures import hf_config
    from rlcurate.rollout.fixed_shape import bucket_rows

    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    card = GPUS[gpu]
    arch = arch_config if arch_config is not None else hf_config(config.model)
    if prompt_tokens is None:
        if config.task not in PROMPT_TOKENS:
            raise ValueError(f"no prompt length recorded for task {config.task!r}; pass prompt_tokens")
        prompt_tokens = PROMPT_TOKENS[config.task]
    p_min, p_mean, p_max = prompt_tokens
    p_max = min(p_max, config.max_prompt_tokens)
    n = param_count(arch)
    layers = arch.num_hidden_layers
    gc = bool(getattr(config, "gradient_checkpointing", False))
    a_tok = ACTIVATION_MARGIN * activation_bytes_per_token(arch, gradient_checkpointing=gc)
    a_layer = layer_bytes_per_token(arch)
    k = layer_dims(arch)[2]

    memory: dict[str, float] = {"weights": 4.0 * n, "gradients": 4.0 * n, "adam": 8.0 * n, "bf16_copies": 2.0 * n}
    if config.kl_coef > 0:
        memory["reference"] = 4.0 * n
    if config.rollout_weights == "bf16":
        memory["rollout_copy"] = 2.0 * n
    L = config.max_new_tokens
    mb_tokens = config.micro_batch_tokens
    if getattr(config, "micro_batch_memory_gib", 0) > 0:  # the trainer sizes micro-batches the same way
        mb_tokens = micro_batch_tokens_for(arch, config.micro_batch_memory_gib * GiB, gc)
    rows = max(1, mb_tokens // (p_min + L))
    tokens = rows * L
    prompts = math.ceil(rows / max(config.group_size, 1))
    c_transient = 3.0 if getattr(arch, "model_type", "") == "qwen3" else 0.5
    train = {"activations": a_tok * tokens,
             "prompt_pass": a_tok * prompts * p_mean,
             "prompt_kv_rows": rows * layers * 4 * k * p_mean,
             "transient": 1.5 * GiB + c_transient * a_layer * tokens}
    gen_rows = max(1, config.gen_token_budget // (p_mean + L))
    kv_token = kv_bytes_per_token(arch, KV_DTYPE_BYTES[config.dtype])
    per_layer_s, per_row_s, bucketed = decode_rates(config)
    per_step_rollouts = config.prompts_per_step * config.group_size
    eval_rollouts = config.eval_prompts * config.eval_samples
    generation = {"kv_cache": kv_token * config.gen_token_budget, "logits": 3 * 4 * gen_rows * arch.vocab_size}
    if bucketed:
        # held from the first generation to the end of the run, training included (rlcurate.rollout.fixed_shape):
        # the cache of the largest batch's bucket of rows x (longest prompt + L, in 64s), and per recorded bucket
        # (a step's and an evaluation's) the step's fp32 logits and its graph's [rows, vocab] tensors (the
        # forward's fp32 logits, the tensor sampler's three fp64 ones; the fused sampler writes none, so an upper
        # bound): 32 bytes a row and token of the vocabulary, counted, not measured
        # a hinting strategy (SAGE) writes up to hint_max_new_tokens of hint into the user turn: longer prompts
        hint = int((config.strategy_kwargs or {}).get("hint_max_new_tokens", 0) or 0)
        most_rows = min(config.gen_token_budget // (p_min + L), max(per_step_rollouts, eval_rollouts))
        memory["decode_cache"] = kv_token * bucket_rows(most_rows) * -(-(p_max + hint + L) // 64) * 64
        buckets = {bucket_rows(min(r, most_rows)) for r in (per_step_rollouts, eval_rollouts) if r > 0}
        memory["decode_state"] = 32 * arch.vocab_size * sum(buckets)
        generation = {"logits": 0.0}
    static = sum(memory.values())
    train_total, gen_total = sum(train.values()), sum(generation.values())
    memory.update({f"train_{k}": v for k, v in train.items()})
    memory.update({f"gen_{k}": v for k, v in generation.items()})
    peak = static + max(train_total, gen_total)

    # ---------------------------------------------------------------- time
    rollouts = per_step_rollouts * config.steps  # steps >= 1: the config refuses anything else
    if config.max_rollouts:
        rollouts = min(rollouts, config.max_rollouts)

    def generate_seconds(n_rollouts: int) -> float:
        if n_rollouts <= 0:
            return 0.0
        batches = math.ceil(n_rollouts / gen_rows)
        rows_per_batch = bucket_rows(math.ceil(n_rollouts / batches)) if bucketed else n_rollouts / batches
        return batches * L * (per_layer_s * layers + per_row_s * rows_per_batch)

    train_flops = 6.0 * n * per_step_rollouts * (L + p_mean / max(config.group_size, 1))
    train_s = train_flops * config.update_epochs / (card["bf16_flops"] * TRAIN_MATMUL_SHARE)
    if gc:
        train_s *= 4 / 3
    total_steps = max(1, math.ceil(rollouts / per_step_rollouts))
    n_evals = 0
    if config.eval_every_rollouts:
        n_evals = 1 + rollouts // config.eval_every_rollouts
    elif config.eval_every:
        n_evals = 1 + total_steps // config.eval_every
    gen_step = generate_seconds(per_step_rollouts)
    eval_each = generate_seconds(eval_rollouts)
    seconds = {"generate_per_step": gen_step, "train_per_step": train_s, "eval_each": eval_each,
               "total": total_steps * (gen_step + train_s) + n_evals * eval_each}

    checkpoint = 3 * 4 * n  # the trainer's fp32 master weights and AdamW's two moments
    disk_need, disk_why = config.out_dir_need(checkpoint, 4 * n)
    plan = Plan(config=name or config.model, gpu=gpu, params=n, memory=memory, peak_bytes=peak,
                capacity_bytes=card["memory"], seconds=seconds, disk=(disk_need, checkpoint, disk_why),
                assumptions={"prompt_tokens": [p_min, p_mean, p_max],
                             "micro_batch_tokens": mb_tokens, "micro_batch_rows": rows,
                             "generation_rows": gen_rows, "rollouts": rollouts,
                             "steps": total_steps, "evaluations": n_evals,
                             "activation_bytes_per_token": a_tok,
                             "decode_rate": DECODE_RATE_SOURCE["captured" if bucketed else "eager"],
                             "time_model": "decode steps at max_new_tokens each (an upper bound); "
                                           + ("captured decode step" if bucketed else "eager decode loop")})
    if not plan.fits and bucketed:
        held = (memory["decode_cache"] + memory["decode_state"]) / GiB
        plan.advice.append(f"decode: dynamic (the {config.decode} step's cache and state, {held:.1f} GiB, are held "
                           f"through training), or a smaller gen_token_budget")
    if not plan.fits:
        over = peak - card["memory"]
        if train_total >= gen_total:
            per_budget_token = (train_total - 1.5 * GiB) / max(mb_tokens, 1)
            fit_tokens = int((card["memory"] - static - 1.5 * GiB) / max(per_budget_token, 1))
            if fit_tokens >= p_min + L:
                plan.advice.append(f"micro_batch_tokens <= {fit_tokens // 1024 * 1024} (now {mb_tokens}); "
                                   f"{over / GiB:.1f} GiB over")
            if not gc:
                plan.advice.append("or gradient_checkpointing: true")
        else:
            fit = int((card["memory"] - static - generation["logits"]) / kv_token)
            plan.advice.append(f"gen_token_budget <= {fit // 1024 * 1024} (now {config.gen_token_budget})")
    return plan


# ------------------------------------------------------------------------------------------ the command
def _suite_configs(path):
    """``(run name, seeds, TrainConfig)`` of each run of a suite. A plan writes nothing: the configs' output
    folders name a place under ``runs/`` that is never created."""
    from rlcurate.experiments import load_suite, run_config

    suite = load_suite(path)
    nowhere = Path("runs") / "plan"
    return suite, [(name, suite["seeds"], run_config(suite, name, suite["seeds"][0], nowhere)) for name in suite["runs"]]


def main(argv: list[str] | None = None) -> int:
    from rlcurate._help import ArgumentParser, HelpFormatter, wrap
    from rlcurate.errors import UserError
    from rlcurate.train.config import TrainConfig, apply_overrides

    p = ArgumentParser(prog="rlcurate plan", formatter_class=HelpFormatter,
                       description=wrap("Predict the peak GPU memory and the GPU-hours of training configurations "
                                        "or of a suite on one GPU, and refuse what does not fit, naming the knob "
                                        "to turn (appendix A1). Exit status 1 if anything does not fit."))
    p.add_argument("--config", nargs="+", default=[], help="training configs (YAML)")
    p.add_argument("--suite", nargs="+", default=[], help="suites (configs/suites/NAME.yaml): every run and seed")
    p.add_argument("--gpu", default="h100-80gb", help=f"one of: {', '.join(GPUS)}")
    p.add_argument("--prompt-tokens", type=int, nargs=3, metavar=("MIN", "MEAN", "MAX"),
                   help="prompt lengths in tokens (default: measured for the task)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (of every --config and of every run of a --suite)")
    args = p.parse_args(argv)
    if not args.config and not args.suite:
        raise UserError("give --config or --suite")
    if args.gpu not in GPUS:
        raise UserError(f"--gpu {args.gpu!r}: unknown; known: {', '.join(GPUS)}")
    prompt = tuple(args.prompt_tokens) if args.prompt_tokens else None
    if prompt and not 1 <= prompt[0] <= prompt[1] <= prompt[2]:
        raise UserError(f"--prompt-tokens MIN MEAN MAX must be whole numbers with 1 <= MIN <= MEAN <= MAX, "
                        f"got {' '.join(map(str, prompt))}")
    jobs = [(path, 1, TrainConfig.load(path, args.overrides)) for path in args.config]
    suites = []
    for path in args.suite:
        suite, runs = _suite_configs(path)
        suites.append((suite["name"], path, [f"{path}:{name}" for name, _, _ in runs]))
        jobs += [(f"{path}:{name}", len(seeds),
                  TrainConfig.from_dict(apply_overrides(config.to_dict(), args.overrides), source=f"{path}:{name} (with --set)")
                  if args.overrides else config) for name, seeds, config in runs]
    from rlcurate.curation import build_curator
    from rlcurate.tasks.registry import validate_task

    for name, _, config in jobs:  # the names a plan would otherwise read past (a misspelt strategy still "fits")
        try:
            validate_task(config.task, config.task_kwargs)
            build_curator(config.strategy, **config.strategy_kwargs)
        except UserError as exc:
            raise UserError(f"{name}: {exc}") from None
    refused = 0
    hours: dict[str, float] = {}
    for name, copies, config in jobs:
        try:
            plan = plan_config(config, args.gpu, prompt, name=name)
        except (KeyError, ValueError) as exc:
            raise UserError(f"{name}: {exc.args[0]}") from None
        print(plan.describe())
        hours[name] = plan.gpu_hours * copies
        if copies > 1:
            print(f"  x {copies} seeds: {hours[name]:.1f} GPU-hours")
        refused += not plan.fits
    for suite_name, path, names in suites:
        total = sum(hours[n] for n in names)
        print(f"suite {suite_name} ({path}): {total:.0f} GPU-hours on one {args.gpu} ({total / 24:.1f} days)")
    if refused:
        print(f"rlcurate plan: {refused} configuration(s) do not fit on {args.gpu}", file=sys.stderr)
    return 1 if refused else 0
