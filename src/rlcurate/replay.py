"""Replays of committed reference runs that hold on any processor (issue #26; chapter 10's runs).

A *replay fixture* is a small file beside the tests (``tests/replays/<suite>/<run>_s<seed>.json.gz``)
that pins the first steps of one committed run:

* ``calls``: every ``generate`` call of those steps with its prompts and sampled tokens
  (:class:`rlcurate.rollout.forced.RecordingEngine`);
* ``sampled``: the per-step metrics of the sampled run on the recording machine, which
  :func:`record_fixture` checks against the committed run's metrics before it writes anything;
* ``forced``: the per-step metrics of the teacher-forced replay on the recording machine
  (:class:`rlcurate.rollout.forced.ForcedEngine`): the reference any later replay is compared with;
* ``recorded_on``: the processor and its kernel signature (:func:`rlcurate.provenance.kernel_signature`).

:func:`forced_replay` re-runs the steps with the current code on the recorded tokens, so no sampled
token can flip, and :func:`compare_steps` compares its metrics with ``forced``: counts exactly, floats
to the tolerances of :data:`TOLERANCES`, which were set from the differences measured across kernel
paths (``data/bench/replay_kernels.json``, made by ``bench/bench_replay_kernels.py``). The sampler is
checked on the side, token by token (near-ties counted, mismatches fail).
"""

from __future__ import annotations

import gzip
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from rlcurate.errors import UserError
from rlcurate.train.config import TrainConfig

__all__ = ["TOLERANCES", "compare_steps", "fixture_path", "forced_replay", "load_fixture", "record_fixture",
           "relative_differences", "save_fixture"]

# Relative tolerances of the float metrics of a forced replay, over an absolute floor of 1e-7, set from
# measurements (bench/bench_replay_kernels.py, data/bench/replay_kernels.json): the largest relative
# difference of each metric over every fixture between the recording and forced replays with one and two
# threads, with ATen's kernels held to AVX2 and to the portable default, and with MKL and oneDNN held to
# AVX2 as well; and between the committed runs (AMD EPYC) and the same steps sampled on an Intel Xeon.
# Largest measured: entropy 1.2e-5, grad_norm 5.6e-6, curation/dro_query_score_mean 1.9e-7, every other
# float 0. Each tolerance is ten times its metric's largest, rounded up to 1, 2 or 5 x 10^k; a metric not
# named gets "other", 50 times the largest difference measured among them.
TOLERANCES = {"entropy": 2e-4, "grad_norm": 1e-4, "other": 1e-5}
ABS_FLOOR = 1e-7
SKIP_PREFIXES = ("time/", "eval/")


def fixture_path(root: str | Path, suite: str, run: str, seed: int) -> Path:
    return Path(root) / suite / f"{run}_s{seed}.json.gz"


def save_fixture(fixture: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(fixture, f, separators=(",", ":"))
    tmp.replace(path)
    return path


def load_fixture(path: str | Path) -> dict[str, Any]:
    try:
        with gzip.open(path, "rt") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable replay fixture ({exc})") from None


def _replay_config(result: dict[str, Any], steps: int, scratch: Path, threads: int | None) -> TrainConfig:
    data = {**result["config"], "out_dir": str(Path(scratch) / f"{result['suite']}_{result['run']}_s{result['seed']}"),
            "steps": int(steps), "resume": False, "progress": False, "checkpoint_every": 0, "save_model": False,
            "eval_every": 0, "eval_every_rollouts": 0}
    if threads:
        data["threads"] = int(threads)
    return TrainConfig.from_dict(data, source=f"replay of {result['suite']}/{result['run']} seed {result['seed']}")


@contextmanager
def _restored_threads():
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(config: TrainConfig, wrap: Callable) -> tuple[list[dict[str, Any]], Any]:
    """Train ``config`` with its rollout engine wrapped by ``wrap``; returns the metrics records (without
    machine timings and evaluations) and the wrapped engine."""
    from rlcurate.train import Trainer

    with _restored_threads():
        trainer = Trainer(config, final_checkpoint=False)  # nothing resumes a replay
        engine = wrap(trainer.engine)
        trainer.engine = trainer.policy.engine = engine
        trainer.run()
    lines = (Path(config.out_dir) / "metrics.jsonl").read_text().splitlines()
    records = [{k: v for k, v in json.loads(line).items() if not k.startswith(SKIP_PREFIXES)} for line in lines]
    return [r for r in records if r.get("step", 0) >= 1], engine


def record_fixture(result: dict[str, Any], steps: int, scratch: str | Path) -> dict[str, Any]:
    """Sample the first ``steps`` steps of the committed run ``result`` while recording every rollout,
    check them against the run's stored metrics (counts exactly, floats to :data:`TOLERANCES`), then
    replay them teacher-forced on this machine; returns the fixture (see the module docstring).
    Raises :class:`~rlcurate.errors.UserError` when this machine's sampled steps are not the committed
    run's (a token flipped here: record fewer steps)."""
    from rlcurate.provenance import cpu_name, kernel_signature
    from rlcurate.rollout.forced import ForcedEngine, RecordingEngine

    config = _replay_config(result, steps, Path(scratch) / "sampled", None)
    sampled, recorder = _train(config, RecordingEngine)
    stored = [r for r in result["metrics"] if 1 <= r["step"] <= steps]
    problems = compare_steps(stored, sampled, keys_of="stored")
    if problems:
        raise UserError(f"{result['suite']}/{result['run']} seed {result['seed']}: this machine's first {steps} "
                        f"sampled step(s) are not the committed run's: {problems[0]}")
    config = _replay_config(result, steps, Path(scratch) / "forced", None)
    forced, engine = _train(config, lambda inner: ForcedEngine(inner, recorder.calls))
    return {
        "suite": result["suite"], "run": result["run"], "seed": result["seed"], "steps": int(steps),
        "config": result["config"],
        "recorded_on": {"cpu": cpu_name(), "kernels": kernel_signature()},
        "calls": recorder.calls, "sampled": sampled, "forced": forced,
        "sampler": {"tokens": engine.check.tokens, "near_ties": engine.check.near_ties,
                    "mismatches": engine.check.mismatches},
    }


def forced_replay(fixture: dict[str, Any], scratch: str | Path, threads: int | None = None,
                  steps: int | None = None):
    """Replay a fixture's steps (its first ``steps`` only, if given) with the current code on its
    recorded tokens; returns ``(metrics, sampler check)`` (:class:`rlcurate.rollout.forced.SamplerCheck`).
    ``threads`` overrides the run's CPU threads (a kernel path of its own)."""
    from rlcurate.rollout.forced import ForcedEngine, ReplayMismatch

    steps = fixture["steps"] if steps is None else int(steps)
    if not 1 <= steps <= fixture["steps"]:
        raise ValueError(f"steps must lie in 1..{fixture['steps']}, got {steps}")
    config = _replay_config(fixture, steps, scratch, threads)
    metrics, engine = _train(config, lambda inner: ForcedEngine(inner, fixture["calls"]))
    if steps == fixture["steps"] and engine.served != len(fixture["calls"]):
        raise ReplayMismatch(f"the replay made {engine.served} generate call(s), the recording holds "
                             f"{len(fixture['calls'])}")
    return metrics, engine.check


def _tolerance(key: str) -> float:
    return TOLERANCES.get(key, TOLERANCES["other"])


def _is_count(value: Any) -> bool:
    return isinstance(value, (bool, int)) or value is None or isinstance(value, str)


def compare_steps(stored: list[dict[str, Any]], now: list[dict[str, Any]], keys_of: str = "both",
                  tolerances: Callable[[str], float] = _tolerance) -> list[str]:
    """Differences between two lists of per-step metrics records, one line each: a step or key missing,
    a count (int, bool, str) that differs, a float outside ``tolerances(key)`` relative (over
    :data:`ABS_FLOOR`). With ``keys_of="stored"`` only the stored records' keys are compared (a
    committed run keeps a subset of the metrics)."""
    problems = []
    by_step = {r["step"]: r for r in now}
    for old in stored:
        new = by_step.get(old["step"])
        if new is None:
            problems.append(f"step {old['step']}: missing")
            continue
        keys = set(old) if keys_of == "stored" else set(old) | set(new)
        for key in sorted(k for k in keys if not k.startswith(SKIP_PREFIXES)):
            if key not in old or key not in new:
                problems.append(f"step {old['step']} {key}: only in the {'stored' if key in old else 'new'} record")
                continue
            a, b = old[key], new[key]
            if _is_count(a) or _is_count(b):
                if a != b:
                    problems.append(f"step {old['step']} {key}: {a!r} -> {b!r}")
                continue
            a, b = float(a), float(b)
            if math.isnan(a) and math.isnan(b):
                continue
            if not abs(a - b) <= max(tolerances(key) * max(abs(a), abs(b)), ABS_FLOOR):
                problems.append(f"step {old['step']} {key}: {a!r} -> {b!r} (relative {relative(a, b):.2e}, "
                                f"tolerance {tolerances(key):.0e})")
    return problems


def relative(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|), 0 when both are 0."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def relative_differences(stored: list[dict[str, Any]], now: list[dict[str, Any]]) -> dict[str, float]:
    """The largest relative difference of every float metric between two lists of per-step records
    (what :data:`TOLERANCES` were set from)."""
    out: dict[str, float] = {}
    by_step = {r["step"]: r for r in now}
    for old in stored:
        new = by_step.get(old["step"], {})
        for key, a in old.items():
            b = new.get(key)
            if key.startswith(SKIP_PREFIXES) or not isinstance(a, float) or not isinstance(b, (int, float)):
                continue
            if abs(a - b) <= ABS_FLOOR:
                d = 0.0
            else:
                d = relative(a, float(b))
            out[key] = max(out.get(key, 0.0), d)
    return out
