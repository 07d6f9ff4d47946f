"""Checkpoint and resume (chapter 5): a run killed with SIGKILL and resumed gives exactly the metrics
of an uninterrupted run on CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlcurate.train import Trainer, TrainConfig

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "data" / "tiny" / "spread"


def _config(out: Path) -> dict:
    return {"model": str(CHECKPOINT), "task": "arithmetic",
            "task_kwargs": {"levels": ["add2", "add3", "sub2", "mul2x1"], "n_train": 32, "n_test": 8},
            "strategy": "uniform", "seed": 3, "steps": 10, "prompts_per_step": 4, "group_size": 4,
            "max_new_tokens": 48, "lr": 3e-4, "eval_every": 4, "eval_prompts": 16, "eval_samples": 2,
            "checkpoint_every": 2, "threads": 1, "progress": False, "save_model": False, "out_dir": str(out)}


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_metrics(tmp_path):
    reference = tmp_path / "reference"
    Trainer(TrainConfig.from_dict(_config(reference))).run()

    killed = tmp_path / "killed"
    cfg_file = tmp_path / "killed.yaml"
    cfg_file.write_text(yaml.safe_dump(_config(killed)))
    cmd = [sys.executable, "-m", "rlcurate.cli", "train", "--config", str(cfg_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 6:  # step-0 eval + 5 steps
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"training ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines_at_kill = len(metrics.read_text().splitlines())
    assert 6 <= lines_at_kill < 11, lines_at_kill

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _metrics(killed) == _metrics(reference)
    assert len(_metrics(reference)) == 11  # the step-0 evaluation and 10 steps


def test_resume_refuses_nothing_and_truncates_metrics(tmp_path):
    """A resumed trainer cuts metrics.jsonl back to the lines its checkpoint saw."""
    out = tmp_path / "run"
    cfg = _config(out)
    cfg.update(steps=4, eval_every=0)
    Trainer(TrainConfig.from_dict(cfg)).run()
    full = _metrics(out)
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 99, "junk": true}\n')
    tr = Trainer(TrainConfig.from_dict({**cfg, "steps": 4}))
    assert tr.step == 4 and tr.metrics.lines == len(full)
    assert _metrics(out) == full


def test_a_step_with_only_uniform_groups_leaves_the_model_unchanged(tmp_path):
    """Regression: such a step used to re-apply the previous step's gradient (found in chapter 5)."""
    import torch

    tr = Trainer(TrainConfig.from_dict({**_config(tmp_path / "run"), "steps": 1, "eval_every": 0,
                                        "checkpoint_every": 0}))
    tr.train_step(0)  # a normal step leaves gradients (and Adam moments) behind
    before = [p.detach().clone() for p in tr.model.parameters()]
    lr_before = tr.scheduler.get_last_lr()
    out = tr.policy.update([], [])
    assert out["grad_norm"] == 0.0 and out["loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    assert len(tr.scheduler.get_last_lr()) == len(lr_before)  # the schedule moved on without error
