"""Supervised warm-start of the tiny model on arithmetic (chapter 4, *The variance audit*).

GRPO learns only from prompts whose sampled groups disagree, so a policy that is to be trained with
RL must already solve some prompts some of the time. This module trains the tiny Qwen2 model from
scratch by next-token prediction on reference completions (scratchpad, ``#``, answer, end of
sequence; the loss covers only the assistant part), with a share of prompts that carry a hint
(the first 1-3 reference steps, chapter 7) so that the model learns to use hints. Along the way it
measures, on held-out prompts, how many of ``n`` samples at temperature 1 are correct, and it can
save several stages of one run. The checkpoints in ``data/tiny`` come from::

    python -m rlcurate.models.warmstart --out data/tiny --steps 2500 --seed 0 \\
        --save-at early=500,spread=875,saturated=2500 --eval-every 250 --threads 1

(the same as ``rlcurate warmstart ...``). A run is bitwise reproducible for a given seed and number of
threads on CPU; evaluations and saving draw no randomness from the training stream, so a stage saved
at step k of a long run equals the end of a k-step run (the learning rate is constant after warm-up).

Each checkpoint directory holds the Hugging Face checkpoint (safetensors, tokenizer, chat template),
``train_config.json``, ``train_log.jsonl`` (losses and held-out evaluations with pass-count
histograms), ``rlcurate.json`` and a ``README.md`` with the command, the wall time and the versions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, count_params, package_versions, save_tiny
from rlcurate.tasks.arithmetic import HINT_LEVELS, TINY_LEVELS, ArithmeticTask, levels_of
from rlcurate.tasks.base import Problem

BUCKETS = 8  # batches drawn at once and bucketed by length
# Sampling weights of TINY_LEVELS in the warm-start: fewer easy, more long problems, so that the levels
# reach mixed pass rates at about the same time.
TINY_LEVEL_WEIGHTS = (0.5, 0.75, 1.0, 0.75, 1.0, 1.25, 1.25, 1.5, 1.0)


@dataclass
class WarmStartConfig:
    """Hyper-parameters of a warm-start run (chapter 4). Defaults are the ones used for ``data/tiny``."""

    steps: int = 2500
    """Optimizer steps."""
    seed: int = 0
    """Seeds the initial weights, the training stream and the evaluation samples."""
    levels: tuple[str, ...] = TINY_LEVELS
    """Arithmetic levels trained on (and evaluated on), e.g. ``("add2", "mul2x1")``."""
    level_weights: tuple[float, ...] | None = None
    """Relative sampling weight of each level. None: :data:`TINY_LEVEL_WEIGHTS` when ``levels`` are
    the default :data:`~rlcurate.tasks.arithmetic.TINY_LEVELS`, uniform otherwise."""
    scratchpad: bool = True
    """Train on scratchpad completions (reasoning steps before ``#answer``) or on ``#answer`` only."""
    hint_share: float = 0.0
    """Share of training prompts that carry a hint of level 1-3 (drawn uniformly). Not needed with
    the tiny style's assistant-side hints: every reference completion already teaches the model to
    continue from each prefix of its steps. User-turn hints (``hint_placement="user"``) were ignored
    by the model at shares 0.25 and 0.5, since their targets are computable without them."""
    hint_placement: str | None = None
    """Where hints go (:class:`~rlcurate.tasks.arithmetic.ArithmeticTask`): None for the task's default
    (``"assistant"`` with the scratchpad), or ``"assistant"`` / ``"user"``."""
    hint_eval: bool = True
    """At each saved stage, also measure held-out pass rates with hints of level 1-3 (chapter 7)."""
    batch_size: int = 64
    """Sequences per optimizer step."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    warmup_steps: int = 100
    """Linear warm-up from 0 to ``lr``."""
    schedule: str = "constant"
    """``"constant"`` after warm-up (a stage saved at step k equals a run of k steps) or ``"cosine"``
    (decay to ``min_lr_ratio * lr`` at ``steps``)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule as a share of ``lr``."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    model: dict = field(default_factory=dict)
    """Overrides of the tiny Qwen2 config (``rlcurate.models.tiny.TINY_CONFIG``)."""
    eval_every: int = 500
    """Evaluate on held-out prompts every this many steps (0: only at saved stages and the end)."""
    eval_per_level: int = 32
    """Held-out prompts per level in each evaluation."""
    eval_samples: int = 8
    """Samples per held-out prompt."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation (top-k and top-p are off)."""
    log_every: int = 50
    """Write the mean training loss every this many steps."""
    threads: int = 2
    """torch CPU threads."""

    def __post_init__(self):
        self.levels = tuple(self.levels)
        self.betas = tuple(self.betas)
        if self.level_weights is None and self.levels == TINY_LEVELS:
            self.level_weights = TINY_LEVEL_WEIGHTS
        if self.level_weights is not None:
            self.level_weights = tuple(float(w) for w in self.level_weights)

    def validate(self) -> "WarmStartConfig":
        """Raise ``ValueError`` naming the first bad field; return self."""
        for name in ("steps", "batch_size", "eval_samples", "log_every", "threads", "eval_per_level"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("seed", "warmup_steps", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if not 0.0 <= self.hint_share <= 1.0:
            raise ValueError(f"hint_share must lie in [0, 1], got {self.hint_share!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip!r}")
        if not self.eval_temperature > 0:
            raise ValueError(f"eval_temperature must be > 0, got {self.eval_temperature!r}")
        if self.level_weights is not None:
            w = np.asarray(self.level_weights, dtype=float)
            if w.shape != (len(self.levels),) or (w < 0).any() or w.sum() <= 0:
                raise ValueError(
                    f"level_weights must be {len(self.levels)} non-negative numbers with a positive sum, "
                    f"got {self.level_weights!r}"
                )
        ArithmeticTask(self.levels, scratchpad=self.scratchpad, hint_placement=self.hint_placement)  # validates them
        return self

    def task(self, n_test: int | None = None) -> ArithmeticTask:
        """The tiny-style :class:`ArithmeticTask` this run trains on; its test split is held out."""
        return ArithmeticTask(
            self.levels, style="tiny", scratchpad=self.scratchpad, hint_placement=self.hint_placement,
            n_test=self.eval_per_level if n_test is None else n_test,
        )


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def encode_example(tokenizer, task: ArithmeticTask, problem: Problem, hint_level: int = 0) -> tuple[list[int], int]:
    """Token ids of prompt + reference completion + eos, and the prompt length: the supervised
    example of the warm-start (chapter 4). The prompt carries the hint of ``hint_level`` (chapter 7);
    with an assistant-side hint the completion is the rest of the reference after the revealed steps."""
    prompt = task.render(problem, tokenizer, hint=task.hint(problem, hint_level) or None)
    full = task.render(problem, tokenizer) + task.target(problem)
    # an assistant-side hint is the start of the reference: the model is trained on the rest
    completion = full[len(prompt):] if full.startswith(prompt) else task.target(problem)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return prompt_ids + completion_ids + [tokenizer.eos_token_id], len(prompt_ids)


def _pad_batch(rows: list[list[int]], starts: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (ids, s) in enumerate(zip(rows, starts)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        labels[i, s : len(ids)] = torch.tensor(ids[s:])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def make_batches(tokenizer, task: ArithmeticTask, rng: np.random.Generator, batch_size: int, n_batches: int = 1,
                 hint_share: float = 0.0, level_weights: Sequence[float] | None = None) -> list[dict[str, torch.Tensor]]:
    """``n_batches`` right-padded training batches of fresh train-split problems (chapter 4):
    ``input_ids``, ``attention_mask`` and ``labels`` (-100 on the prompt and the padding, so the loss
    covers the completion and eos). A share ``hint_share`` of the prompts carries a hint of level 1-3.

    The ``n_batches * batch_size`` examples are sorted by length before they are cut into batches
    (length bucketing: less padding, the same data), and the batches come in random order.
    """
    p = None
    if level_weights is not None and len(set(level_weights)) > 1:  # equal weights: uniform, as None
        p = np.asarray(level_weights, dtype=float)
        p = p / p.sum()
    examples = []
    for _ in range(batch_size * n_batches):
        level = task.levels[int(rng.choice(len(task.levels), p=p))]
        problem = task.sample(rng, "train", level)
        hint_level = int(rng.choice(HINT_LEVELS)) if rng.random() < hint_share else 0
        examples.append(encode_example(tokenizer, task, problem, hint_level))
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), i))
    batches = []
    for b in rng.permutation(n_batches):
        chunk = [examples[i] for i in order[b * batch_size : (b + 1) * batch_size]]
        batches.append(_pad_batch([e[0] for e in chunk], [e[1] for e in chunk], tokenizer.pad_token_id))
    return batches


# ----------------------------------------------------------------------------------------------
# Evaluation: pass counts on held-out prompts
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def _sample_rows(model, x: torch.Tensor, max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Ancestral sampling with a KV cache for equal-length prompts ``x``; rows stop at eos."""
    out = model(input_ids=x, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    finished = torch.zeros(x.shape[0], dtype=torch.bool)
    new = []
    for _ in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        new.append(nxt)
        finished |= nxt == eos_id
        if bool(finished.all()):
            break
        out = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(new, dim=1)


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: Sequence[str], n_samples: int = 8, temperature: float = 1.0,
                       max_new_tokens: int = 64, seed: int = 0, batch_rows: int = 1024) -> list[list[str]]:
    """``n_samples`` completions of each prompt by pure ancestral sampling at ``temperature`` (no
    top-k, no top-p), decoded without special tokens (chapter 4). Prompts of equal token length are
    batched together, so no padding is needed; the samples depend only on ``seed`` (a private torch
    generator; the global RNG is untouched)."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(encoded):
        by_len[len(ids)].append(i)
    out: list[list[str]] = [[] for _ in prompts]
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(int(seed))
    per_chunk = max(1, batch_rows // n_samples)
    for length in sorted(by_len):
        idx = by_len[length]
        for c in range(0, len(idx), per_chunk):
            chunk = idx[c : c + per_chunk]
            x = torch.tensor([encoded[i] for i in chunk for _ in range(n_samples)])
            new = _sample_rows(model, x, max_new_tokens, float(temperature), tokenizer.eos_token_id,
                               tokenizer.pad_token_id, generator)
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            for j, i in enumerate(chunk):
                out[i] = texts[j * n_samples : (j + 1) * n_samples]
    model.train(was_training)
    return out


def max_completion_tokens(tokenizer, task: ArithmeticTask, problems: Sequence[Problem], margin: int = 8) -> int:
    """Token budget for sampling: the longest reference completion of ``problems`` plus eos plus ``margin``."""
    longest = max(len(tokenizer(task.target(p), add_special_tokens=False)["input_ids"]) for p in problems)
    return longest + 1 + margin


def pass_counts(model, tokenizer, task: ArithmeticTask, problems: Sequence[Problem], n_samples: int = 8,
                temperature: float = 1.0, seed: int = 0, hint_level: int = 0,
                max_new_tokens: int | None = None) -> np.ndarray:
    """Number of correct samples out of ``n_samples`` for each problem, k_i (chapter 4: the pass
    rate estimate is k_i / n). ``hint_level`` > 0 puts the first steps of the reference solution into
    the prompt (chapter 7)."""
    problems = list(problems)
    if not problems:
        return np.zeros(0, dtype=int)
    prompts = [task.render(p, tokenizer, hint=task.hint(p, hint_level) or None) for p in problems]
    if max_new_tokens is None:
        max_new_tokens = max_completion_tokens(tokenizer, task, problems)
    samples = sample_completions(model, tokenizer, prompts, n_samples, temperature, max_new_tokens, seed)
    return np.array([sum(task.reward(p, s).value for s in ss) for p, ss in zip(problems, samples)], dtype=int)


def summarize_counts(problems: Sequence[Problem], counts, n_samples: int) -> dict:
    """Per-level and overall summary of pass counts (chapter 4): mean pass rate, the histogram of
    k in 0..n (``hist[k]`` = number of prompts with k correct of n), and the share of *mixed* prompts
    (0 < k < n), the only ones that give GRPO a non-zero advantage."""
    counts = np.asarray(counts, dtype=int)
    if len(counts) != len(problems):
        raise ValueError(f"counts must have one entry per problem ({len(problems)}), got {len(counts)}")

    def one(c: np.ndarray) -> dict:
        return {
            "n_prompts": int(len(c)),
            "mean_pass": round(float(c.mean() / n_samples), 4) if len(c) else float("nan"),
            "mixed_share": round(float(((c > 0) & (c < n_samples)).mean()), 4) if len(c) else float("nan"),
            "hist": np.bincount(c, minlength=n_samples + 1).tolist(),
        }

    levels = np.array([p.meta.get("level") for p in problems])
    return {
        "n_samples": n_samples,
        "overall": one(counts),
        "levels": {lv: one(counts[levels == lv]) for lv in levels_of(problems)},
    }


def hint_effect(model, tokenizer, task: ArithmeticTask, problems: Sequence[Problem], base_counts, n_samples: int = 8,
                temperature: float = 1.0, seed: int = 0, max_new_tokens: int | None = None,
                hint_levels: Sequence[int] = HINT_LEVELS) -> dict:
    """Mean pass rate at each hint level, per difficulty level, on all ``problems`` and on the *hard*
    ones (pass count 0 without a hint in ``base_counts``): does the model use a hint? (chapter 7).

    Every column, hint level 0 included, is measured on fresh samples: ``base_counts`` only selects
    the hard prompts, so their hint-0 column shows how much of any gain is regression to the mean.

    Returns ``{"hint_levels": [0, 1, 2, 3], "levels": {name: [p at each hint level]},
    "all": [...], "hard": [...], "n_hard": int}``.
    """
    base_counts = np.asarray(base_counts, dtype=int)
    if len(base_counts) != len(problems):
        raise ValueError(f"base_counts must have one entry per problem ({len(problems)}), got {len(base_counts)}")
    if max_new_tokens is None:
        max_new_tokens = max_completion_tokens(tokenizer, task, problems)
    table = []
    for k in [0, *hint_levels]:
        table.append(pass_counts(model, tokenizer, task, problems, n_samples, temperature, seed=seed + 1 + k,
                                 hint_level=k, max_new_tokens=max_new_tokens))
    rates = np.stack(table) / n_samples  # (hint level, problem)
    levels = np.array([p.meta.get("level") for p in problems])
    hard = base_counts == 0
    return {
        "hint_levels": [0, *hint_levels],
        "levels": {lv: np.round(rates[:, levels == lv].mean(axis=1), 4).tolist() for lv in levels_of(problems)},
        "all": np.round(rates.mean(axis=1), 4).tolist(),
        "hard": np.round(rates[:, hard].mean(axis=1), 4).tolist() if hard.any() else None,
        "n_hard": int(hard.sum()),
    }


def format_hint_effect(hints: dict) -> str:
    """A markdown table of :func:`hint_effect` output, for checkpoint READMEs (chapter 7)."""
    head = " | ".join(f"hint {k}" for k in hints["hint_levels"])
    lines = [f"| level | {head} |", "|---" * (len(hints["hint_levels"]) + 1) + "|"]
    rows = list(hints["levels"].items()) + [("all", hints["all"])]
    if hints["hard"] is not None:
        rows.append((f"hard ({hints['n_hard']} prompts with k=0 in the evaluation above)", hints["hard"]))
    for name, vals in rows:
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    """A markdown table of :func:`summarize_counts` output, for checkpoint READMEs (chapter 4)."""
    n = summary["n_samples"]
    lines = [f"| level | prompts | mean pass | mixed (0<k<{n}) | histogram of k = 0..{n} |", "|---|---|---|---|---|"]
    rows = list(summary["levels"].items()) + [("all", summary["overall"])]
    for name, s in rows:
        lines.append(f"| {name} | {s['n_prompts']} | {s['mean_pass']:.2f} | {s['mixed_share']:.0%} | {s['hist']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def learning_rate(step: int, cfg: WarmStartConfig) -> float:
    """Learning rate at optimizer step ``step`` (0-based) of the warm-start (chapter 4): linear warm-up
    lr (step+1)/warmup, then constant lr, or lr (r + (1-r)(1 + cos(pi t))/2) with t the share of the
    steps after warm-up and r = ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    frac = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


MAX_MIXED = "max-mixed"


def parse_save_at(spec: str | None, steps: int) -> dict:
    """The stages of a warm-start run to save (chapter 4): ``"early=500,spread=max-mixed,saturated=2500"``
    or ``"500,2500"`` (names ``step500``...) as ``{step: name}``. The step ``max-mixed`` (at most one)
    picks, after the run, the evaluated step with the largest share of mixed held-out prompts."""
    if not spec:
        return {}
    out: dict = {}
    for item in spec.split(","):
        item = item.strip()
        name, _, step_text = item.rpartition("=")
        if step_text == MAX_MIXED:
            step = MAX_MIXED
            if not name:
                raise ValueError(f"save_at item {item!r} needs a name: NAME={MAX_MIXED}")
        else:
            try:
                step = int(step_text)
            except ValueError:
                raise ValueError(f"save_at items must be STEP, NAME=STEP or NAME={MAX_MIXED}, got {item!r}") from None
            if not 1 <= step <= steps:
                raise ValueError(f"save_at step must lie in 1..{steps}, got {item!r}")
        name = name or f"step{step}"
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"save_at names must be plain words, got {item!r}")
        if step in out:
            raise ValueError(f"save_at names step {step} twice: {spec!r}")
        if name in out.values():
            raise ValueError(f"save_at uses the name {name!r} twice: {spec!r}")
        out[step] = name
    return out


def _write_readme(path: Path, *, command: str, cfg: WarmStartConfig, stage: str | None, step: int,
                  wall_s: float, summary: dict | None, n_params: int, hints: dict | None = None) -> None:
    versions = package_versions()
    lines = [
        f"# Tiny arithmetic model{f' - stage `{stage}`' if stage else ''}",
        "",
        f"A {n_params:,}-parameter Qwen2-architecture model trained from scratch by `rlcurate.models.warmstart` "
        f"(chapter 4) for {step} steps (seed {cfg.seed}) on the arithmetic levels {', '.join(cfg.levels)}; "
        f"{'scratchpad' if cfg.scratchpad else 'direct-answer'} completions, {cfg.hint_share:.0%} of the "
        "training prompts hinted.",
        "",
        "Load it with `AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`, "
        "or `rlcurate.models.tiny.load_tiny(dir)`; pose problems with "
        "`rlcurate.tasks.arithmetic.ArithmeticTask(style='tiny')`.",
        "",
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        f"Wall time until this checkpoint: {wall_s:.0f} s ({wall_s / 60:.1f} min) on {torch.get_num_threads()} CPU "
        f"thread(s), held-out evaluations included.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
    ]
    if summary is not None:
        lines += [
            f"## Held-out pass counts at step {step}",
            "",
            f"{summary['overall']['n_prompts']} held-out prompts, {summary['n_samples']} samples each at temperature "
            f"{cfg.eval_temperature:g} (top-k and top-p off); k is the number of correct samples.",
            "",
            format_summary(summary),
            "",
        ]
    if hints is not None:
        lines += [
            "## Pass rates with hints (chapter 7)",
            "",
            "Mean pass rate on the same held-out prompts when the prompt reveals the first k reference steps "
            f"(`ArithmeticTask.hint(problem, k)`, placed in the {cfg.task(n_test=0).hint_placement} turn), each "
            "column on fresh samples (so the hard row's hint-0 column shows the regression to the mean of the "
            "prompts selected for k=0).",
            "",
            format_hint_effect(hints),
            "",
        ]
    lines += ["Files: `train_config.json` (hyper-parameters), `train_log.jsonl` (loss every "
              f"{cfg.log_every} steps, evaluations with histograms), `rlcurate.json`.", ""]
    (path / "README.md").write_text("\n".join(lines))


def train(cfg: WarmStartConfig, out, save_at: dict | None = None, command: str | None = None,
          progress: bool = True) -> dict:
    """Run the warm-start (chapter 4) and write checkpoints.

    With ``save_at`` empty the final model goes to ``out``; otherwise the model at step s goes to
    ``out/save_at[s]`` (see :func:`parse_save_at`; the ``max-mixed`` stage is the evaluated step with
    the most mixed held-out prompts). Every checkpoint directory gets the HF files,
    ``train_config.json``, ``train_log.jsonl`` (the log up to that step), ``rlcurate.json`` and
    ``README.md``; a run with named stages also writes an overview ``out/README.md``. Returns
    ``{"stages": {name: {"step", "path", "wall_s", "eval_s", "eval", "hint_eval"}}, "log": [...]}``.
    """
    cfg.validate()
    out = Path(out)
    save_at = dict(save_at or {})
    if any(s != MAX_MIXED and s > cfg.steps for s in save_at):
        raise ValueError(f"save_at steps must be <= steps={cfg.steps}, got {sorted(map(str, save_at))}")
    if not save_at:
        save_at = {cfg.steps: ""}
    if command is None:
        command = "python -m rlcurate.models.warmstart " + shlex.join(to_argv(cfg, out, save_at))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _Run(cfg, out, save_at, command, progress).run()
    finally:
        torch.set_num_threads(threads_before)


class _Run:
    """One warm-start run: the training loop, evaluations and stage checkpoints."""

    def __init__(self, cfg: WarmStartConfig, out: Path, save_at: dict, command: str, progress: bool):
        self.cfg, self.out, self.save_at, self.command, self.progress = cfg, out, save_at, command, progress
        self.tokenizer = build_tiny_tokenizer()
        self.model = build_tiny_model(cfg.model or None, seed=cfg.seed)
        self.n_params = count_params(self.model)
        self.task = cfg.task()
        self.held_out = self.task.problems("test")
        self.max_new = max_completion_tokens(self.tokenizer, self.task, self.held_out)
        self.log: list[dict] = []
        self.stages: dict[str, dict] = {}
        self.eval_s = 0.0
        self.t0 = time.perf_counter()
        self.best: dict | None = None  # the max-mixed candidate: step, mixed share, weights, eval

    def _eval_seed(self, step: int) -> int:
        return self.cfg.seed * 1_000_003 + step

    def evaluate(self, step: int) -> tuple[dict, np.ndarray]:
        """Held-out pass counts at ``step``; logged, and remembered as the max-mixed candidate."""
        cfg, t = self.cfg, time.perf_counter()
        counts = pass_counts(self.model, self.tokenizer, self.task, self.held_out, cfg.eval_samples,
                             cfg.eval_temperature, seed=self._eval_seed(step), max_new_tokens=self.max_new)
        summary = summarize_counts(self.held_out, counts, cfg.eval_samples)
        self.eval_s += time.perf_counter() - t
        self.log.append({"step": step, "eval": summary, "wall_s": round(time.perf_counter() - self.t0, 2)})
        mixed = summary["overall"]["mixed_share"]
        if MAX_MIXED in self.save_at and (self.best is None or mixed > self.best["mixed"]):
            self.best = {"step": step, "mixed": mixed, "eval": summary, "counts": counts, "eval_s": self.eval_s,
                         "wall_s": time.perf_counter() - self.t0,
                         "weights": {k: v.detach().clone() for k, v in self.model.state_dict().items()}}
        return summary, counts

    def save(self, name: str, step: int, summary: dict, counts, wall: float) -> None:
        """Write the stage checkpoint ``name`` (the model as it is now, trained for ``step`` steps)."""
        cfg, t = self.cfg, time.perf_counter()
        hints = None
        if cfg.hint_eval:
            hints = hint_effect(self.model, self.tokenizer, self.task, self.held_out, counts, cfg.eval_samples,
                                cfg.eval_temperature, seed=self._eval_seed(step), max_new_tokens=self.max_new)
            self.eval_s += time.perf_counter() - t
            wall += time.perf_counter() - t
        log = [r for r in self.log if r["step"] <= step]
        if hints is not None:
            log.append({"step": step, "hint_eval": hints, "wall_s": round(wall, 2)})
            self.log.append(log[-1])
        path = self.out / name if name else self.out
        save_tiny(self.model, self.tokenizer, path, stage=name or None, step=step, seed=cfg.seed,
                  wall_s=round(wall, 1), eval=summary)
        record = {**dataclasses.asdict(cfg), "stage": name or None, "stage_step": step, "command": self.command,
                  "n_params": self.n_params}
        (path / "train_config.json").write_text(json.dumps(record, indent=2) + "\n")
        (path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        _write_readme(path, command=self.command, cfg=cfg, stage=name or None, step=step, wall_s=wall,
                      summary=summary, n_params=self.n_params, hints=hints)
        self.stages[name or "final"] = {"step": step, "path": str(path), "wall_s": round(wall, 1),
                                        "eval": summary, "hint_eval": hints}

    def run(self) -> dict:
        from tqdm import tqdm

        cfg, model = self.cfg, self.model
        data_rng = np.random.default_rng([cfg.seed, 1])
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        loss_sum, tok_sum, n_acc = 0.0, 0, 0
        queue: list[dict[str, torch.Tensor]] = []
        bar = tqdm(range(cfg.steps), desc="warm-start", disable=not self.progress, mininterval=2.0)
        model.train()
        for step in bar:
            # -- one optimizer step on a length-bucketed batch -------------------------------------
            lr = learning_rate(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            if not queue:
                queue = make_batches(self.tokenizer, self.task, data_rng, cfg.batch_size, BUCKETS, cfg.hint_share,
                                     cfg.level_weights)
            batch = queue.pop()
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            opt.step()
            loss_sum += loss.item()
            tok_sum += int((batch["labels"] != -100).sum())
            n_acc += 1
            done = step + 1
            # -- logging, evaluation, stages ---------------------------------------------------------
            if done % cfg.log_every == 0 or done == cfg.steps:
                self.log.append({"step": done, "loss": round(loss_sum / n_acc, 5), "lr": lr,
                                 "grad_norm": round(grad_norm, 4), "trained_tokens": tok_sum,
                                 "wall_s": round(time.perf_counter() - self.t0, 2)})
                bar.set_postfix(loss=f"{loss_sum / n_acc:.3f}")
                loss_sum, n_acc = 0.0, 0
            if (cfg.eval_every and done % cfg.eval_every == 0) or done in self.save_at:
                summary, counts = self.evaluate(done)
                o = summary["overall"]
                per_level = " ".join(f"{k}={v['mean_pass']:.2f}" for k, v in summary["levels"].items())
                bar.write(f"step {done} ({time.perf_counter() - self.t0:.0f} s): mean pass {o['mean_pass']:.3f}, "
                          f"mixed {o['mixed_share']:.0%}, hist {o['hist']} | {per_level}", file=sys.stderr)
                model.train()
            if done in self.save_at:
                self.save(self.save_at[done], done, summary, counts, time.perf_counter() - self.t0)
                model.train()
        bar.close()
        if self.best is not None:
            # the stage with the most mixed prompts: its weights were kept when it was evaluated
            model.load_state_dict(self.best.pop("weights"))
            model.eval()
            self.save(self.save_at[MAX_MIXED], self.best["step"], self.best["eval"], self.best["counts"],
                      self.best["wall_s"])
        if any(self.save_at.values()):
            _write_run_readme(self.out, command=self.command, cfg=cfg, stages=self.stages, n_params=self.n_params)
        return {"stages": dict(sorted(self.stages.items(), key=lambda kv: kv[1]["step"])), "log": self.log}


def _write_run_readme(out: Path, *, command: str, cfg: WarmStartConfig, stages: dict, n_params: int) -> None:
    """An overview ``OUT/README.md`` of a run that saved several stages."""
    n = cfg.eval_samples
    lines = [
        "# Tiny arithmetic checkpoints",
        "",
        f"Stages of one warm-start run of the {n_params:,}-parameter tiny Qwen2 model (`rlcurate.models.warmstart`, "
        "chapter 4); each folder is a Hugging Face checkpoint with its own README, `train_config.json` and "
        "`train_log.jsonl`.",
        "",
        "```",
        command,
        "```",
        "",
        f"Held-out pass counts, {n} samples per prompt at temperature {cfg.eval_temperature:g}:",
        "",
        f"| stage | step | wall time (evaluations included) | mean pass | mixed (0<k<{n}) | histogram of k = 0..{n} |",
        "|---|---|---|---|---|---|",
    ]
    for name, st in sorted(stages.items(), key=lambda kv: kv[1]["step"]):
        ev = st["eval"]["overall"] if st["eval"] else None
        if ev is None:
            lines.append(f"| `{name}` | {st['step']} | {st['wall_s'] / 60:.1f} min | - | - | - |")
        else:
            lines.append(f"| `{name}` | {st['step']} | {st['wall_s'] / 60:.1f} min | {ev['mean_pass']:.2f} | "
                         f"{ev['mixed_share']:.0%} | {ev['hist']} |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in package_versions().items()) + ".", ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text("\n".join(lines))


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``rlcurate warmstart`` / ``python -m rlcurate.models.warmstart`` (chapter 4)."""
    d = WarmStartConfig()
    from rlcurate._help import ArgumentParser, HelpFormatter, plain, wrap

    p = ArgumentParser(prog="rlcurate warmstart", description=wrap(__doc__.split("\n\n")[0]),
                                formatter_class=HelpFormatter,
                                epilog="the checkpoints in data/tiny come from:\n" + plain(
                                    __doc__.split("::\n")[1].split("\n\n(")[0]).replace(
                                    "python -m rlcurate.models.warmstart", "rlcurate warmstart"))
    p.add_argument("--out", required=True, help="output directory (stages go to OUT/NAME)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of weights, data and evaluation samples")
    p.add_argument("--save-at", default=None,
                   help=f"stages to save: NAME=STEP,... or STEP,...; NAME={MAX_MIXED} saves the evaluated step "
                        "with the most mixed held-out prompts")
    p.add_argument("--levels", default=",".join(d.levels), help="comma-separated arithmetic levels")
    p.add_argument("--level-weights", default=None,
                   help="comma-separated sampling weights of the levels (default: TINY_LEVEL_WEIGHTS for the "
                        "default levels, uniform otherwise)")
    p.add_argument("--no-scratchpad", action="store_true", help="train on direct answers '#answer' only")
    p.add_argument("--hint-share", type=float, default=d.hint_share, help="share of hinted training prompts")
    p.add_argument("--hint-placement", choices=["assistant", "user"], default=None,
                   help="where hints go (default: the task's, 'assistant' with the scratchpad)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear learning-rate warm-up")
    p.add_argument("--schedule", choices=["constant", "cosine"], default=d.schedule,
                   help="learning rate after the warm-up")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="clip the global gradient norm (0: off)")
    p.add_argument("--hidden-size", type=int, default=None, help="override the model width (default 128)")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers (default 4)")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="0: only at saved stages")
    p.add_argument("--eval-per-level", type=int, default=d.eval_per_level, help="held-out prompts per level")
    p.add_argument("--eval-samples", type=int, default=d.eval_samples, help="samples per held-out prompt")
    p.add_argument("--log-every", type=int, default=d.log_every, help="write the training loss every this many steps")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads")
    p.add_argument("--no-hint-eval", action="store_true", help="skip the hint-level evaluation at saved stages")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def config_from_args(args: argparse.Namespace) -> WarmStartConfig:
    """A validated :class:`WarmStartConfig` from parsed command-line arguments (chapter 4)."""
    model: dict = {}
    if args.hidden_size is not None:
        model.update(hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size)
    if args.layers is not None:
        model.update(num_hidden_layers=args.layers)
    levels = tuple(s.strip() for s in args.levels.split(",") if s.strip())
    weights = None
    if args.level_weights:
        try:
            weights = tuple(float(w) for w in args.level_weights.split(","))
        except ValueError:
            raise ValueError(f"--level-weights must be comma-separated numbers, got {args.level_weights!r}") from None
    return WarmStartConfig(
        steps=args.steps, seed=args.seed, levels=levels,
        level_weights=weights, scratchpad=not args.no_scratchpad, hint_share=args.hint_share,
        hint_placement=args.hint_placement,
        batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, model=model, eval_every=args.eval_every,
        eval_per_level=args.eval_per_level, eval_samples=args.eval_samples, log_every=args.log_every,
        threads=args.threads, hint_eval=not args.no_hint_eval,
    ).validate()


def to_argv(cfg: WarmStartConfig, out, save_at: dict[int, str]) -> list[str]:
    """Command-line arguments that reproduce ``cfg`` (the inverse of :func:`config_from_args`); written
    into each checkpoint's README (chapter 4)."""
    d = WarmStartConfig()
    argv = ["--out", str(out), "--steps", str(cfg.steps), "--seed", str(cfg.seed)]
    named = {s: n for s, n in save_at.items() if n}
    if named:
        argv += ["--save-at", ",".join(f"{n}={s}" for s, n in named.items())]
    pairs = [("levels", ",".join(cfg.levels), ",".join(d.levels)), ("hint-share", cfg.hint_share, d.hint_share),
             ("batch-size", cfg.batch_size, d.batch_size), ("lr", cfg.lr, d.lr),
             ("warmup-steps", cfg.warmup_steps, d.warmup_steps), ("schedule", cfg.schedule, d.schedule),
             ("weight-decay", cfg.weight_decay, d.weight_decay), ("grad-clip", cfg.grad_clip, d.grad_clip),
             ("eval-every", cfg.eval_every, d.eval_every), ("eval-per-level", cfg.eval_per_level, d.eval_per_level),
             ("eval-samples", cfg.eval_samples, d.eval_samples), ("log-every", cfg.log_every, d.log_every),
             ("threads", cfg.threads, d.threads)]
    if cfg.level_weights != WarmStartConfig(levels=cfg.levels).level_weights:
        pairs.append(("level-weights", ",".join(f"{w:g}" for w in cfg.level_weights), None))
    if "hidden_size" in cfg.model:
        pairs.append(("hidden-size", cfg.model["hidden_size"], None))
    if "num_hidden_layers" in cfg.model:
        pairs.append(("layers", cfg.model["num_hidden_layers"], None))
    for flag, value, default in pairs:
        if value != default:
            argv += [f"--{flag}", str(value)]
    if cfg.hint_placement is not None:
        argv += ["--hint-placement", cfg.hint_placement]
    if not cfg.scratchpad:
        argv.append("--no-scratchpad")
    if not cfg.hint_eval:
        argv.append("--no-hint-eval")
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlcurate warmstart`` and ``python -m rlcurate.models.warmstart`` (chapter 4)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        save_at = parse_save_at(args.save_at, cfg.steps)
    except ValueError as exc:
        parser.error(str(exc))
    command = "python -m rlcurate.models.warmstart " + shlex.join(to_argv(cfg, args.out, save_at))
    result = train(cfg, args.out, save_at, command=command, progress=not args.no_progress)
    for name, stage in result["stages"].items():
        ev = stage["eval"]["overall"] if stage["eval"] else {}
        print(f"{name}: step {stage['step']}, {stage['wall_s']:.0f} s, mean pass {ev.get('mean_pass')}, "
              f"mixed {ev.get('mixed_share')} -> {stage['path']}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    from rlcurate.cli import main as _cli

    raise SystemExit(_cli(["warmstart", *sys.argv[1:]]))
