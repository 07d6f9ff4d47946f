"""The READMEs of warm-start checkpoints (chapter 4): the command that reproduces them, the wall
time, the versions and the held-out pass counts as markdown tables.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlcurate.models.warmstart.config import WarmStartConfig
from rlcurate.provenance import package_versions

__all__ = ["format_hint_effect", "format_summary", "write_readme", "write_run_readme"]


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


def write_readme(path: Path, *, command: str, cfg: WarmStartConfig, stage: str | None, step: int,
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
            "Mean pass rate on the same held-out prompts posed with the hint of level k "
            f"(`ArithmeticTask.placed_hint(problem, k)`, in the {cfg.task(n_test=0).hint_placement} turn: "
            + ("the first k reference steps" if cfg.task(n_test=0).hint_placement == "assistant" else
               "SAGE's answer-free hint, the first k steps but never the last one or one that states the answer")
            + "), each "
            "column on fresh samples (so the hard row's hint-0 column shows the regression to the mean of the "
            "prompts selected for k=0).",
            "",
            format_hint_effect(hints),
            "",
        ]
    lines += ["Files: `train_config.json` (hyper-parameters), `train_log.jsonl` (loss every "
              f"{cfg.log_every} steps, evaluations with histograms), `rlcurate.json`.", ""]
    (path / "README.md").write_text("\n".join(lines))


def write_run_readme(out: Path, *, command: str, cfg: WarmStartConfig, stages: dict, n_params: int) -> None:
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
