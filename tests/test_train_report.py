"""``report_to`` (issue #33): a run's metrics streamed to TensorBoard and Weights & Biases through their own
libraries, read back here with their own readers; a run that crashed after its last checkpoint and was
resumed continues the same curves without a duplicated point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcurate.errors import UserError
from rlcurate.train import Trainer, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def _config(out: Path, report_to) -> dict:
    return {"model": str(REPO / "data" / "tiny" / "spread"), "task": "arithmetic",
            "task_kwargs": {"levels": ["add2", "add3"], "n_train": 16, "n_test": 4}, "seed": 0, "steps": 5,
            "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "eval_every": 2, "eval_prompts": 4,
            "eval_samples": 1, "checkpoint_every": 2, "threads": 1, "progress": False, "save_model": False,
            "out_dir": str(out), "report_to": report_to}


def _crash_then_resume(out: Path, report_to, monkeypatch) -> list[dict]:
    """Steps 1-3 (a checkpoint after 2), a crash during step 4, then the same config resumed to step 5."""
    step = Trainer.train_step

    def crashing(self, i):
        if i == 3:
            raise RuntimeError("the machine went away")
        return step(self, i)

    monkeypatch.setattr(Trainer, "train_step", crashing)
    with pytest.raises(RuntimeError, match="went away"):
        Trainer(TrainConfig.from_dict(_config(out, report_to))).run()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == [0, 1, 2, 3]
    monkeypatch.setattr(Trainer, "train_step", step)
    Trainer(TrainConfig.from_dict(_config(out, report_to))).run()
    return [json.loads(line) for line in (out / "metrics.jsonl").open()]


def _numeric(records):
    return {k for r in records for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def test_tensorboard_gets_every_metric_and_a_resume_leaves_no_duplicate(tmp_path, monkeypatch, one_thread):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    records = _crash_then_resume(out, "tensorboard", monkeypatch)
    by_step = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    by_step.Reload()
    tags = set(by_step.Tags()["scalars"])
    assert _numeric(records) <= tags
    loss = by_step.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5]  # step 4 of the crashed session purged, not doubled
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in records if "loss" in r], rel=1e-6)
    assert [e.step for e in by_step.Scalars("eval/accuracy")] == [0, 2, 4, 5]
    by_rollouts = EventAccumulator(str(out / "tensorboard" / "by_rollouts"), size_guidance={"scalars": 0})
    by_rollouts.Reload()
    rollouts = [e.step for e in by_rollouts.Scalars("by_rollouts/eval/accuracy")]
    assert rollouts == [r.get("total/rollouts", 0) for r in records if "eval/accuracy" in r] == sorted(set(rollouts))
    config = by_step.Tensors("config/text_summary")
    assert config and b'"report_to": "tensorboard"' in config[0].tensor_proto.string_val[0]


def _wandb_records(path: Path):
    """The records of an offline W&B run file: a 7-byte header (``:W&B``, magic, version), then LevelDB's log
    format (32 KiB blocks; each record a CRC, a length, a type: full, first, middle or last piece)."""
    import struct

    data, pos, block, pieces = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind in (2, 3):
            pieces = (pieces if kind == 3 else b"") + chunk
        elif kind == 4:
            yield pieces + chunk


def _finished_wandb_records(path: Path, timeout_s: float = 60.0) -> list[bytes]:
    """The records of a run file once its exit record is there: ``run.finish()`` can return before wandb's
    service process has written the file's last records (seen: a resumed session's history missing from the
    file when read at once, present a moment later)."""
    import time

    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout_s
    while True:
        records = list(_wandb_records(path))
        last = wandb_internal_pb2.Record()
        try:
            last.ParseFromString(records[-1] if records else b"")
        except DecodeError:  # a record still being written
            pass
        if last.WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s:.0f} s"
        time.sleep(0.1)


def _wandb_history(out: Path) -> list[dict]:
    """Every history row of every offline W&B session under ``out``, parsed with wandb's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        for data in _finished_wandb_records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
                rows.append({"_step": rec.history.step.num, **row})
    return rows


def test_wandb_offline_gets_every_metric_and_a_resume_leaves_no_duplicate(tmp_path, monkeypatch, one_thread):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    records = _crash_then_resume(out, ["wandb"], monkeypatch)
    rows = _wandb_history(out)
    steps = [row["_step"] for row in rows]
    assert steps == [0, 1, 2, 3, 4, 5]  # the crashed session logged 0-3; the resumed one 4 and 5, no repeat
    assert _numeric(records) <= {k for row in rows for k in row}
    assert [row["loss"] for row in rows if "loss" in row] == pytest.approx([r["loss"] for r in records if "loss" in r])
    assert all("by_rollouts/eval/accuracy" in row for row in rows if "eval/accuracy" in row)
    assert len({p.name.split("-")[3] for p in (out / "wandb").glob("offline-run-*")}) == 1  # one run id (offline-run-DATE_TIME-ID[-N]: wandb adds -N when two sessions start in the same second)


def test_report_to_is_checked():
    with pytest.raises(UserError, match="report_to must be none or a list of tensorboard, wandb"):
        TrainConfig(report_to="mlflow")
    assert TrainConfig(report_to="tensorboard,wandb").report_to == "tensorboard,wandb"
