"""The GRPO trainer (chapter 5, *The GRPO loop*). It reads top to bottom like the algorithm:

    for each step:                        rlcurate.curation.step.run_step, the same in every world
        1. select prompts                     curator.select
        2. sample rollouts, score them        curator.rollout   (the engine, the verifier)
        3. keep / downsample / reweight       curator.process
        4. advantages                         rlcurate.curation.base.group_advantages
        5. loss and optimizer step            rlcurate.train.policy.LMPolicy.update
        6. update the curator's beliefs       curator.observe
        7. log metrics; evaluate; checkpoint  here

The trainer does not know which curation strategy runs. Compute is accounted at every step and
cumulatively: rollouts and tokens generated (kept or not), tokens trained, generation and training
wall time. A checkpoint holds the whole state (model, optimizer, scheduler, curator, data order,
metrics position), and all randomness of a step is derived from (seed, step), so a resumed run
reproduces the metrics of an uninterrupted one exactly on CPU.

What the trainer refuses or leaves out, and says so:

- before the model loads, everything :func:`rlcurate.train.preflight.preflight` checks (strategy,
  task and their arguments, the model path, the run folder, ``group_size=1``, and a resume with a
  different config);
- prompts longer than ``max_prompt_tokens`` tokens: left out of training and evaluation, counted in
  the log and in ``summary.json`` (``prompts_too_long``); if no training prompt is left, refused;
- rollouts whose reward is not finite (a task's ``reward`` returned NaN or inf): their groups are left
  out of the step (the loss, the advantages and the curator's update never see them), counted in
  the step's ``nonfinite_reward_rollouts`` and in the log;
- an update whose gradient norm is not finite: the optimizer step is skipped (the weights and Adam's
  moments stay as they were), counted in the step's ``nonfinite_grad_steps``.

The last two keys appear in a step's metrics only when they are not 0.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlcurate.curation.base import Curator, StepContext
from rlcurate.curation.step import run_step
from rlcurate.errors import Stopped, UserError, write_failure
from rlcurate.seeding import EVAL_SEED_OFFSET
from rlcurate.stopping import catch_stop_signals
from rlcurate.stats.gate import outcome_shares
from rlcurate.tasks.base import split_long_prompts
from rlcurate.train.config import TrainConfig
from rlcurate.train.policy import LMPolicy

TIMING_PREFIX = "time/"  # metrics that depend on the machine, not on the algorithm
log = logging.getLogger(__name__)


class MetricsLog:
    """Append-only ``metrics.jsonl``; on resume it is cut back to the lines the checkpoint saw.

    Every line is handed to the operating system at once (it survives a killed process); the file is
    forced to disk (fsync) only when a checkpoint is saved (:meth:`sync`), which is all a resume needs:
    lines written after the last checkpoint are cut on resume anyway. One fsync per step used to cost
    a few percent of a tiny-model step (appendix A1).
    """

    def __init__(self, path: Path):
        self.path = path
        self.sinks: list = []  # TensorBoard, W&B (rlcurate.train.report): every record written goes to each
        self.lines = 0
        if path.exists():
            self.lines = sum(1 for _ in path.open())

    def truncate(self, lines: int) -> None:
        kept = self.path.read_text().splitlines(keepends=True)[:lines] if self.path.exists() else []
        self.path.write_text("".join(kept))
        self.lines = len(kept)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        self.lines += 1
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def sync(self) -> None:
        """Force the lines written so far to disk (called before a checkpoint records their number)."""
        if self.path.exists():
            with self.path.open("a") as f:
                os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.open()] if self.path.exists() else []


class Trainer:
    """GRPO with a pluggable curation strategy. ``Trainer(config).run()`` trains and returns a summary.

    ``model``, ``tokenizer``, ``task`` and ``curator`` may be passed in (tests, notebooks); otherwise
    they are built from the config. Bad input is refused before the model loads (see the module
    docstring) with a :class:`~rlcurate.errors.UserError`.
    """

    def __init__(self, config: TrainConfig, *, model=None, tokenizer=None, task=None,
                 curator: Curator | None = None, ref_model=None, final_checkpoint: bool = True):
        from rlcurate.models.dry_run import dry_run_model
        from rlcurate.train.dry_run import coin_reward, dry_run_config
        from rlcurate.train.preflight import preflight

        # a chapter's GPU cell in a dry run (rlcurate.dryrun): a Hub model becomes a random-weight one
        dry = model is None and dry_run_model(config.model) is not None
        if dry:
            config = dry_run_config(config)
        self.config = config
        task, curator, self.resume_changes = preflight(config, task=task, curator=curator,
                                                       check_model=model is None or tokenizer is None)
        if dry:
            coin_reward(task)
        self.final_checkpoint = bool(final_checkpoint) and not dry
        """Whether :meth:`run` ends by writing the checkpoint a later run resumes from. Off for a dry run or a replay,
        which nothing resumes (a 135M-parameter model's checkpoint with its optimizer is 1.6 GB)."""
        self.out = Path(config.out_dir)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"out_dir={config.out_dir!r} cannot be made: {exc.strerror or exc}") from None
        if config.threads:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if config.device == "auto" else config.device))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError("device is 'cuda' but CUDA is not available on this machine")
        use_bf16 = self.device.type == "cuda" and config.dtype in ("auto", "bf16")
        if config.dtype == "bf16" and self.device.type != "cuda":
            raise UserError("dtype bf16 needs CUDA; use fp32 or auto on CPU")
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else nullcontext

        # ---------------------------------------------------------------- task, model, engine
        self.task = task
        if model is None or tokenizer is None:
            from rlcurate.models import load_policy

            model, tokenizer = load_policy(config.model, device=str(self.device), dtype="fp32")
        self.model = model.to(self.device)
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.ref_model = None
        if config.kl_coef > 0:
            import copy

            self.ref_model = (ref_model or copy.deepcopy(self.model)).to(self.device).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        from rlcurate.rollout import SamplingParams, TransformersEngine

        self.engine = TransformersEngine(self.model, tokenizer, token_budget=config.gen_token_budget,
                                         decode=config.decode,
                                         rollout_dtype=torch.bfloat16 if config.rollout_weights == "bf16" else None)
        self.sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                                       max_new_tokens=config.max_new_tokens)
        self.eval_sampling = SamplingParams(temperature=config.eval_temperature, top_p=1.0,
                                            max_new_tokens=config.max_new_tokens)
        self._rendered: dict[tuple, str] = {}  # (uid, hint) or (uid, hint, hint_mode) -> prompt text
        self._select_problems(task)

        # ---------------------------------------------------------------- curator, optimizer
        self.curator = curator
        self.curator.bind(len(self.train_problems), config.seed + config.order_offset)
        # the fused AdamW kernel (one pass over all parameters; TRL's default too) where torch has it
        fused = self.device.type in ("cpu", "cuda") and all(p.is_floating_point() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay, fused=fused or None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.policy = LMPolicy(self.model, tokenizer, self.engine, config, self.optimizer, self.scheduler,
                               ref_model=self.ref_model, autocast=self.autocast)
        if config.micro_batch_memory_gib > 0:  # micro-batches sized from a memory budget (appendix A1)
            from rlcurate.policy.memory import micro_batch_tokens_for

            self.policy.token_budget = micro_batch_tokens_for(
                self.model.config, config.micro_batch_memory_gib * 2**30, config.gradient_checkpointing)
            log.info("micro-batches of at most %d tokens for micro_batch_memory_gib = %g", self.policy.token_budget,
                     config.micro_batch_memory_gib)

        # ---------------------------------------------------------------- logs and resume
        self.metrics = MetricsLog(self.out / "metrics.jsonl")
        self.step = 0
        # trained_*: what the loss ran forward and backward on (per step samples_nonzero_adv, chapter 10's
        # cost_sparse); kept_*: every sample of the groups kept after curation (per step the older key
        # samples_trained, what a dense trainer such as verl trains on, cost_dense). Logged names, kept as run.
        self.totals = {"rollouts": 0, "generated_tokens": 0, "trained_tokens": 0, "trained_samples": 0,
                       "kept_samples": 0, "kept_tokens": 0,
                       "time/generate": 0.0, "time/train": 0.0, "time/eval": 0.0}
        self.config_changes: list[dict[str, Any]] = []  # the allowed changes of each resume (preflight)
        if config.resume and ((self.out / "checkpoint").exists() or (self.out / "checkpoint.old").exists()):
            self.load_checkpoint()
            if self.resume_changes:
                changes = {k: [old, new] for k, (old, new) in sorted(self.resume_changes.items())}
                self.config_changes.append({"step": self.step, "changes": changes})
                log.warning("resuming %s at step %d with a changed config: %s", self.out, self.step,
                            ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
        else:
            self._own_folder()
            self.metrics.truncate(0)
        self._check_disk()  # after an earlier run's checkpoints are removed: their space is free
        config.save(self.out / "config.json")
        if config.warmup_note():
            log.warning("%s", config.warmup_note())

    def _own_folder(self) -> None:
        """A fresh run owns its folder: the checkpoints of an earlier run there are removed at the start, so
        that a later resume (after this run is stopped before its first checkpoint) cannot pick them up and
        mix two runs. The metrics are cut by the caller."""
        import shutil

        stale = [self.out / name for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp")
                 if (self.out / name).exists()]
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if stale and not self.config.resume:
            log.warning("%s: a fresh run (resume=false) removed the checkpoint of an earlier run there", self.out)
        elif stale:  # resume=true found only a checkpoint that was never completed
            log.warning("%s: no complete checkpoint to resume from; removed %s, which an earlier run left "
                        "half-written, and started from step 0", self.out, ", ".join(p.name for p in stale))

    def _select_problems(self, task) -> None:
        """The prompt-length guard: training and held-out problems whose prompt has more than
        ``max_prompt_tokens`` tokens are left out, counted and logged; none left to train on is refused."""
        c = self.config

        def render(problem):
            try:
                return self._render(problem, None)
            except Exception as exc:  # e.g. a chat template that knows no system turn (the tiny model's)
                raise UserError(f"model {c.model!r} cannot render task {c.task!r}'s prompt {problem.uid!r} with its "
                                f"tokenizer's chat template: {type(exc).__name__}: {exc}") from None

        train = task.problems("train")
        if not train:
            raise UserError(f"task {c.task!r} has no training problems")
        if c.train_subset:
            from rlcurate.train.preflight import train_subset

            train = train_subset(c, train)
        self.train_problems, long_train = split_long_prompts(train, render, self.tokenizer, c.max_prompt_tokens)
        self.test_problems, long_test = split_long_prompts(task.problems(c.eval_split), render, self.tokenizer,
                                                           c.max_prompt_tokens, keep=c.eval_prompts)
        self.prompts_too_long = {"train": len(long_train), "test": len(long_test)}
        for split, skipped in (("training", long_train), ("held-out", long_test)):
            if skipped:
                for p, _ in skipped:
                    self._rendered.pop((p.uid, None), None)
                uid, n = max(((p.uid, n) for p, n in skipped), key=lambda item: item[1])
                log.warning("left out %d %s prompt(s) longer than max_prompt_tokens=%d (longest: %s, %d tokens or "
                            "more)", len(skipped), split, c.max_prompt_tokens, uid, n)
        if not self.train_problems:
            raise UserError(f"every training prompt of task {c.task!r} is longer than max_prompt_tokens="
                            f"{c.max_prompt_tokens} tokens; raise max_prompt_tokens (0: no limit)")
        if long_train:
            from rlcurate.train.preflight import check_pool_size

            check_pool_size(c, self.train_problems, left_out=len(long_train))

    # ------------------------------------------------------------------ schedule
    def _lr_factor(self, step: int) -> float:
        c = self.config
        if c.warmup_steps and step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.lr_schedule == "cosine":
            span = max(c.steps - c.warmup_steps, 1)
            progress = min((step - c.warmup_steps) / span, 1.0)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def _render(self, problem, hint, hint_mode=None):
        # hint_mode (chapter 7: where a SAGE hint goes) joins the key only when given, so the
        # prompt-length guard's (uid, None) entries stay what they were
        key = (problem.uid, hint) if hint_mode is None else (problem.uid, hint, hint_mode)
        if key not in self._rendered:
            self._rendered[key] = (self.task.render(problem, self.tokenizer, hint=hint) if hint_mode is None else
                                   self.task.render(problem, self.tokenizer, hint=hint, hint_mode=hint_mode))
        return self._rendered[key]

    # ------------------------------------------------------------------ one step
    def context(self, step: int) -> StepContext:
        c = self.config
        return StepContext(step=step, seed=c.seed, problems=self.train_problems, task=self.task,
                           group_size=c.group_size, prompts_per_step=c.prompts_per_step, policy=self.policy,
                           sampling=self.sampling, render=self._render, curator_seed=c.seed + c.order_offset)

    def train_step(self, step: int) -> dict[str, Any]:
        """One step (:func:`rlcurate.curation.step.run_step`) and its metrics record."""
        c = self.config
        self.policy.step = step
        out = run_step(self.curator, self.context(step), self.policy, c.advantage, c.adv_eps)
        update = dict(out.update)
        counters = out.counters
        self.totals["rollouts"] += counters.rollouts
        self.totals["generated_tokens"] += counters.generated_tokens
        self.totals["trained_tokens"] += update["trained_tokens"]
        self.totals["trained_samples"] += update["samples_nonzero_adv"]
        self.totals["kept_samples"] = self.totals.get("kept_samples", 0) + update["samples_trained"]
        self.totals["kept_tokens"] = self.totals.get("kept_tokens", 0) + update["kept_tokens"]
        self.totals["time/generate"] += out.sample_seconds
        self.totals["time/train"] += out.train_seconds
        record = {
            "step": step + 1,
            **out.group_metrics(),
            "rollouts": counters.rollouts,
            "generated_tokens": counters.generated_tokens,
            "lr": float(self.scheduler.get_last_lr()[0]),
            **update,
            **self.curator.metrics(),
            **{f"total/{k}": v for k, v in self.totals.items() if not k.startswith(TIMING_PREFIX)},
            "time/generate": out.sample_seconds,
            "time/train": out.train_seconds,
            **{f"time/total_{k.split('/')[1]}": v for k, v in self.totals.items() if k.startswith(TIMING_PREFIX)},
        }
        if out.nonfinite_rewards:
            record["nonfinite_reward_rollouts"] = out.nonfinite_rewards
        if counters.uncharged_rollouts:  # an oracle arm's free pass-rate estimates (chapter 11), outside any budget
            self.totals["uncharged_rollouts"] = self.totals.get("uncharged_rollouts", 0) + counters.uncharged_rollouts
            record["uncharged_rollouts"] = counters.uncharged_rollouts
            record["total/uncharged_rollouts"] = self.totals["uncharged_rollouts"]
        return record

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy: ``eval_samples`` samples per held-out prompt at ``eval_temperature``,
        with the same seed at every evaluation (common random numbers make steps comparable)."""
        c = self.config
        t0 = time.perf_counter()
        prompts = [self._render(p, None) for p in self.test_problems]
        with self.autocast():
            out = self.engine.generate(prompts, c.eval_samples, self.eval_sampling, seed=c.seed + EVAL_SEED_OFFSET)
        R = np.array([[self.task.reward(p, comp.text).value for comp in comps]
                      for p, comps in zip(self.test_problems, out)])
        self.totals["time/eval"] += time.perf_counter() - t0
        nonfinite = int((~np.isfinite(R)).sum())
        if nonfinite:  # a broken verifier: such a sample counts as wrong, and the count is logged and kept
            log.warning("evaluation: %d sample(s) got a non-finite reward from task %r; counted as wrong",
                        nonfinite, self.config.task)
            R = np.where(np.isfinite(R), R, 0.0)
        shares = outcome_shares(R)
        extra = {"eval/nonfinite_rewards": nonfinite} if nonfinite else {}
        return {**extra, "eval/accuracy": float(R.mean()),
                "eval/pass_at_k": float(((R >= 1).sum(axis=1) > 0).mean()),
                "eval/mixed": shares["mixed"],
                "eval/all_right": shares["always_right"],
                "eval/all_wrong": shares["always_wrong"]}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Write the whole state to ``out_dir/checkpoint`` atomically (tmp dir, then rename)."""
        tmp = self.out / "checkpoint.tmp"
        final = self.out / "checkpoint"
        old = self.out / "checkpoint.old"
        self.metrics.sync()  # the lines this checkpoint counts are on disk before it exists
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                        "torch_rng": torch.get_rng_state()}, tmp / "state.pt")
            (tmp / "trainer.json").write_text(json.dumps({
                "step": self.step, "metrics_lines": self.metrics.lines, "totals": self.totals,
                "curator": self.curator.state_dict(), "config": self.config.to_dict(),
                "config_changes": self.config_changes}, indent=1))
        except Exception as exc:
            if (reason := write_failure(exc)) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            kept = f"the checkpoint at step {self._checkpoint_step()} is kept" if final.exists() or old.exists() \
                else "no earlier checkpoint"
            raise UserError(f"{self.out}: could not write the checkpoint of step {self.step} ({reason}; "
                            f"{self._free_mib():.0f} MiB free there): {kept}; free some space and run the same "
                            f"command to resume") from None
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def save_final_model(self) -> None:
        """Export the trained model and its tokenizer to ``out_dir/final`` (``save_model``), after the last
        checkpoint: a failed write is one line, and the same command writes it again."""
        final = self.out / "final"
        try:
            self.model.save_pretrained(final)
            self.tokenizer.save_pretrained(final)
        except Exception as exc:
            if (reason := write_failure(exc)) is None:
                raise
            shutil.rmtree(final, ignore_errors=True)
            raise UserError(f"{self.out}: could not write the final model ({reason}; {self._free_mib():.0f} MiB free "
                            f"there): the checkpoint at step {self.step} is kept; free some space and run the same "
                            f"command to write it") from None

    def _check_disk(self) -> None:
        """Refuse, before the first step, a run whose checkpoints cannot fit where they go: each holds the weights
        and AdamW's two moments (``torch.save`` writes them whole), and :meth:`TrainConfig.out_dir_need` says how
        many are on disk at once. Otherwise the run would stop at a checkpoint having trained for nothing since
        the last one."""
        if not (self.final_checkpoint or self.config.checkpoint_every or self.config.save_model):
            return  # the run writes nothing there
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        checkpoint = weights + 2 * sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)
        resumed = any((self.out / n).exists() for n in ("checkpoint", "checkpoint.old"))  # after _own_folder
        need, why = self.config.out_dir_need(checkpoint, weights, resumed)
        free = shutil.disk_usage(self.out).free
        if free < need:
            raise UserError(f"{self.out}: {free / 2**30:.2f} GiB free there, but this run needs {need / 2**30:.2f} GiB: "
                            f"checkpoints of {checkpoint / 2**30:.2f} GiB (the weights and AdamW's two moments), {why}; "
                            f"free some space or choose another out_dir")

    def _free_mib(self) -> float:
        return shutil.disk_usage(self.out).free / 2**20

    def _checkpoint_step(self) -> int | None:
        for name in ("checkpoint", "checkpoint.old"):
            meta = self.out / name / "trainer.json"
            if meta.exists():
                return int(json.loads(meta.read_text())["step"])
        return None

    def load_checkpoint(self) -> None:
        path = self.out / "checkpoint"
        if not path.exists():
            path = self.out / "checkpoint.old"  # killed between the two renames
        meta = json.loads((path / "trainer.json").read_text())
        try:
            state = torch.load(path / "state.pt", map_location=self.device, weights_only=False)
        except (EOFError, RuntimeError, pickle.UnpicklingError) as exc:
            from rlcurate.train.preflight import DAMAGED_REMEDY

            raise UserError(f"{path / 'state.pt'} cannot be read ({exc}); {DAMAGED_REMEDY}") from None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        try:
            self.curator.load_state_dict(meta["curator"])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:  # the strategy's code changed
            raise UserError(f"{path / 'trainer.json'}: the curator state saved at step {meta['step']} does not load "
                            f"into strategy {self.config.strategy!r} ({type(exc).__name__}: {exc}): its state_dict "
                            f"changed since the checkpoint; restore the strategy's code it was made with, or start "
                            f"afresh with resume=false") from None
        self.step = int(meta["step"])
        self.totals = meta["totals"]
        self.config_changes = list(meta.get("config_changes", []))
        self.metrics.truncate(int(meta["metrics_lines"]))

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Train until ``config.steps``; returns the final evaluation and totals."""
        from rlcurate.train.report import open_sinks, parse_report_to

        c = self.config
        sinks = parse_report_to(c.report_to)
        if sinks:
            from rlcurate.provenance import provenance

            kept = self.metrics.read()
            self.metrics.sinks = open_sinks(sinks, self.out, kept[-1] if kept else None,
                                            {**c.to_dict(), "provenance": provenance(device=self.device)})
        try:
            return self._run()
        finally:
            self.metrics.close()

    def _run(self) -> dict[str, Any]:
        from tqdm import tqdm

        c = self.config
        if self.step == 0 and self.metrics.lines == 0:
            self._write_environment()
            if c.eval_every or c.eval_every_rollouts:
                self.metrics.write({"step": 0, **self.evaluate(), **({"eval/grid": 0} if c.eval_every_rollouts else {})})
        bar = tqdm(total=c.steps, initial=self.step, disable=not c.progress, desc="train", unit="step")
        with catch_stop_signals() as stop:
            self._loop(bar, stop)
        bar.close()
        if self.final_checkpoint:
            self.save_checkpoint()
        if c.save_model:
            self.save_final_model()
        evals = [r for r in self.metrics.read() if "eval/accuracy" in r]
        summary = {"steps": self.step, "first_eval": evals[0] if evals else None,
                   "final_eval": evals[-1] if evals else None, "totals": self.totals}
        if self.config_changes:
            summary["config_changes"] = self.config_changes
        if any(self.prompts_too_long.values()):
            summary["prompts_too_long"] = {**self.prompts_too_long, "max_prompt_tokens": c.max_prompt_tokens}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return summary

    def _loop(self, bar, stop) -> None:
        """The training steps of :meth:`run`; after each step, a stop signal (``stop``) saves a checkpoint
        of that step and raises :class:`~rlcurate.errors.Stopped` (the same command resumes it)."""
        c = self.config
        held_out = None  # the last held-out accuracy, shown in the bar
        while self.step < c.steps and not self._budget_spent():
            t0 = time.perf_counter()
            before = self.totals["rollouts"]
            record = self.train_step(self.step)
            self.step += 1
            last = self.step == c.steps or self._budget_spent()
            grid = self._grid_crossed(before, self.totals["rollouts"])
            if (c.eval_every and self.step % c.eval_every == 0) or grid is not None or (
                    last and (c.eval_every or c.eval_every_rollouts)):
                bar.set_description("eval")  # an evaluation can take as long as several steps
                record.update(self.evaluate())
                bar.set_description("train")
                held_out = record["eval/accuracy"]
                if c.eval_every_rollouts:
                    record["eval/grid"] = grid if grid is not None else self.totals["rollouts"]
            record["time/step"] = time.perf_counter() - t0
            self.metrics.write(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", eff=f"{record['effective_prompt_ratio']:.2f}",
                            **({"held_out": f"{held_out:.3f}"} if held_out is not None else {}))
            if last:
                break
            if (c.checkpoint_every and self.step % c.checkpoint_every == 0) or stop.requested:
                self.save_checkpoint()
            if stop.requested:
                bar.close()
                raise Stopped(f"{stop.name} at step {self.step} of {c.steps}: a checkpoint of this step is saved in "
                              f"{self.out / 'checkpoint'}; run the same command again to resume", 128 + stop.signum)

    def _grid_crossed(self, before: int, after: int) -> int | None:
        """The largest multiple of ``eval_every_rollouts`` in (before, after], if any (chapter 10)."""
        E = self.config.eval_every_rollouts
        if not E or after // E == before // E:
            return None
        return (after // E) * E

    def _budget_spent(self) -> bool:
        return bool(self.config.max_rollouts) and self.totals["rollouts"] >= self.config.max_rollouts

    def _write_environment(self) -> None:
        from rlcurate.provenance import provenance

        env = provenance(device=self.device)  # the keys of every run record (rlcurate.provenance)
        (self.out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
