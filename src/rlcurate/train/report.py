"""Streaming a run's metrics to TensorBoard and Weights & Biases through their own libraries (issue #33).

``TrainConfig.report_to`` names the sinks (``tensorboard``, ``wandb``, both, or none). Every record the
trainer writes to ``metrics.jsonl`` goes to each sink: every number under its own name, against the
training step; the evaluations also against the generated rollouts (``by_rollouts/...``), the compute axis
chapter 10 reads them on. The config and the run's provenance are the run's hyper-parameters.

A resumed run continues the same curves without duplicated points. The trainer cuts ``metrics.jsonl`` back
to its checkpoint on resume, and each sink continues from there: TensorBoard's writers purge every event
from the first step (and the first rollout count) the checkpoint did not see (``purge_step``);
W&B (offline unless ``WANDB_MODE`` says otherwise, its files in ``out_dir/wandb``) keeps the run's id in
``out_dir/wandb_id`` and skips the steps an earlier session already logged (a resumed run recomputes them
identically on a CPU, tests/test_train_report.py).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Iterable

from rlcurate.errors import UserError

REPORT_SINKS = ("tensorboard", "wandb")


def parse_report_to(value: Any) -> tuple[str, ...]:
    """``report_to`` as a tuple of sink names: ``none``/empty, one name, a comma-separated string or a list."""
    if value in (None, "", "none"):
        return ()
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in REPORT_SINKS]
    if bad or not all(isinstance(n, str) for n in names):
        raise UserError(f"report_to must be none or a list of {', '.join(REPORT_SINKS)}, got {value!r}")
    import importlib.util

    for name in names:  # checked with the config, before any model is loaded
        if importlib.util.find_spec(name) is None:
            raise UserError(f"report_to: {name} needs the {name} package: pip install 'rlcurate[watch]'")
    return tuple(dict.fromkeys(names))


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step"}


class TensorBoardSink:
    """``torch.utils.tensorboard.SummaryWriter`` into ``out_dir/tensorboard`` (by step) and
    ``out_dir/tensorboard/by_rollouts`` (the evaluations by generated rollouts)."""

    def __init__(self, out: Path, last: dict[str, Any] | None, hparams: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        step = int(last["step"]) + 1 if last else None
        rollouts = int(last.get("total/rollouts", 0)) + 1 if last else None
        self.by_step = SummaryWriter(str(out / "tensorboard"), purge_step=step)
        self.by_rollouts = SummaryWriter(str(out / "tensorboard" / "by_rollouts"), purge_step=rollouts)
        if last is None:
            self.by_step.add_text("config", "```\n" + json.dumps(hparams, indent=1, sort_keys=True) + "\n```", 0)

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        numbers = _numbers(record)
        for key, value in numbers.items():
            self.by_step.add_scalar(key, value, step)
        if "eval/accuracy" in record:
            x = int(record.get("total/rollouts", 0))
            for key, value in numbers.items():
                if key.startswith("eval/"):
                    self.by_rollouts.add_scalar(f"by_rollouts/{key}", value, x)

    def close(self) -> None:
        self.by_step.close()
        self.by_rollouts.close()


class WandbSink:
    """``wandb`` in offline mode by default (files under ``out_dir/wandb``), one run id per ``out_dir``."""

    def __init__(self, out: Path, last: dict[str, Any] | None, hparams: dict[str, Any]):
        import wandb

        id_file, self.state = out / "wandb_id", out / "wandb_state.json"
        if last is None:  # a fresh run: its own id, nothing logged yet
            id_file.unlink(missing_ok=True)
            self.state.unlink(missing_ok=True)
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self.logged_through = int(last["step"]) if last else -1
        if self.state.exists():  # steps an earlier session logged after the checkpoint it resumes from
            self.logged_through = max(self.logged_through, json.loads(self.state.read_text())["logged_through"])
        (out / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlcurate"), id=run_id, resume="allow",
                              dir=str(out), mode=os.environ.get("WANDB_MODE", "offline"), name=out.name,
                              config=hparams, settings=wandb.Settings(silent=True, console="off"))
        self.run.define_metric("total/rollouts")
        self.run.define_metric("by_rollouts/*", step_metric="total/rollouts")

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        if step <= self.logged_through:
            return
        numbers = _numbers(record)
        if "eval/accuracy" in record:
            numbers.update({f"by_rollouts/{k}": v for k, v in numbers.items() if k.startswith("eval/")})
        self.run.log(numbers, step=step)
        self.logged_through = step
        self.state.write_text(json.dumps({"logged_through": step}))

    def close(self) -> None:
        self.run.finish()


def open_sinks(names: Iterable[str], out: Path, last: dict[str, Any] | None, hparams: dict[str, Any]) -> list:
    """The sinks of ``names`` for a run in ``out``; ``last`` is the last record the run kept (``None`` for a
    fresh run), from which a resumed run's curves continue."""
    kinds = {"tensorboard": TensorBoardSink, "wandb": WandbSink}
    return [kinds[name](out, last, hparams) for name in names]
