"""The warm-start's training loop, its evaluations and stage checkpoints (chapter 4)."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rlcurate.errors import UserError, write_failure
from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, count_params, save_tiny
from rlcurate.models.warmstart.config import MAX_MIXED, WarmStartConfig
from rlcurate.models.warmstart.data import BUCKETS, make_batches
from rlcurate.models.warmstart.evaluation import hint_effect, max_completion_tokens, pass_counts, summarize_counts
from rlcurate.models.warmstart.readme import write_readme, write_run_readme

__all__ = ["learning_rate", "train"]


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
        from rlcurate.models.warmstart.cli import COMMAND, to_argv

        command = COMMAND + " " + shlex.join(to_argv(cfg, out, save_at))
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
        record = {**dataclasses.asdict(cfg), "stage": name or None, "stage_step": step, "command": self.command,
                  "n_params": self.n_params}
        try:
            save_tiny(self.model, self.tokenizer, path, stage=name or None, step=step, seed=cfg.seed,
                      wall_s=round(wall, 1), eval=summary)
            (path / "train_config.json").write_text(json.dumps(record, indent=2) + "\n")
            (path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
            write_readme(path, command=self.command, cfg=cfg, stage=name or None, step=step, wall_s=wall,
                         summary=summary, n_params=self.n_params, hints=hints)
        except Exception as exc:
            if (reason := write_failure(exc)) is None:
                raise
            if name:  # what was written of the stage would load as a checkpoint with truncated weights
                shutil.rmtree(path, ignore_errors=True)
            else:  # --out itself (a run without stages), which may hold other files: those that make it a checkpoint
                for f in ("config.json", "generation_config.json", "model.safetensors"):
                    (path / f).unlink(missing_ok=True)
            free = shutil.disk_usage(self.out).free / 2**20
            kept = ", ".join(f"{n!r} (step {s['step']})" for n, s in self.stages.items()) or "none"
            raise UserError(f"{path}: could not write stage {name or 'final'!r} at step {step} ({reason}; {free:.0f} "
                            f"MiB free there): the stages written before are kept: {kept}; free some space and run "
                            f"the same command with --force (it trains again)") from None
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
            if (cfg.eval_every and done % cfg.eval_every == 0) or done in self.save_at or done == cfg.steps:
                # the end too (config: eval_every=0 evaluates "only at saved stages and the end"), so that a
                # max-mixed stage always has a candidate
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
            write_run_readme(self.out, command=self.command, cfg=cfg, stages=self.stages, n_params=self.n_params)
        return {"stages": dict(sorted(self.stages.items(), key=lambda kv: kv[1]["step"])), "log": self.log}
