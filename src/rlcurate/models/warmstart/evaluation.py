"""Held-out pass counts of the warm-start (chapter 4): how many of ``n`` samples at temperature 1 are
correct, per prompt, per level and with hints (chapter 7).

The samples come from :class:`rlcurate.rollout.TransformersEngine`, the engine of the audit and the
trainer, so a warm-start evaluation sees the completions the audit of the same checkpoint would see.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlcurate.tasks.arithmetic import HINT_LEVELS, ArithmeticTask, levels_of
from rlcurate.tasks.base import Problem

__all__ = ["hint_effect", "max_completion_tokens", "pass_counts", "sample_completions", "summarize_counts"]


def sample_completions(model, tokenizer, prompts: Sequence[str], n_samples: int = 8, temperature: float = 1.0,
                       max_new_tokens: int = 64, seed: int = 0, batch_rows: int = 1024) -> list[list[str]]:
    """``n_samples`` completions of each prompt by pure ancestral sampling at ``temperature`` (no
    top-k, no top-p) through :class:`~rlcurate.rollout.TransformersEngine` (chapter 4), in batches
    of at most about ``batch_rows`` rows; the text ends before the eos token. Token ``t`` of sample
    ``j`` of prompt ``i`` is drawn with the engine's ``uniforms(seed, i, j, t)``, so the samples
    depend only on ``seed`` and the prompts (the global RNG is untouched)."""
    from rlcurate.rollout import SamplingParams, TransformersEngine

    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    prompts = list(prompts)
    if not prompts:
        return []
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    engine = TransformersEngine(model, tokenizer, token_budget=max(1, int(batch_rows)) * (longest + max_new_tokens))
    params = SamplingParams(temperature=float(temperature), top_k=0, top_p=1.0, max_new_tokens=int(max_new_tokens))
    groups = engine.generate(prompts, n_samples, params, seed=int(seed))
    return [[c.text for c in group] for group in groups]


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
    prompts = [task.render(p, tokenizer, hint=task.placed_hint(p, hint_level) or None) for p in problems]
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
