"""One provenance record (issue #14, :mod:`rlcurate.provenance`) for training runs, audits, checkpoints
and benchmarks: its keys, and the same keys in every file that records where a result came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from rlcurate.provenance import PACKAGES, package_versions, provenance

REPO = Path(__file__).resolve().parents[1]
KEYS = {"rlcurate", "python", *PACKAGES, "git_sha", "git_dirty", "platform", "cpu", "cores", "device", "gpu",
        "threads", "kernels"}


def test_the_record_has_versions_commit_machine_device_and_threads():
    record = provenance(device=torch.device("cpu"))
    assert set(record) == KEYS
    assert record["torch"] == torch.__version__ and record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["device"] == "cpu" and record["gpu"] is None and record["threads"] == torch.get_num_threads()
    assert record["cpu"] and record["cores"] >= 1 and record["platform"]
    if (REPO / ".git").exists():
        assert len(record["git_sha"]) == 40 and isinstance(record["git_dirty"], bool)
    assert provenance()["device"] is None
    assert set(package_versions(["no-such-package-x"])) == {"rlcurate", "python", *PACKAGES, "no-such-package-x"}
    assert package_versions(["no-such-package-x"])["no-such-package-x"] is None


def test_the_kernel_signature_names_the_code_paths(monkeypatch):
    """Issue #26: what decides whether two machines compute the same floats is in every record."""
    from rlcurate.provenance import kernel_signature

    sig = provenance()["kernels"]
    assert sig["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert sig["threads"] == torch.get_num_threads() and sig["vendor"]
    assert set(sig["isa"]) <= {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16",
                               "amx_tile"}
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert kernel_signature()["env"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert kernel_signature() != sig


def test_training_audits_checkpoints_and_benchmarks_write_the_same_record(tmp_path):
    from rlcurate.audit import AuditConfig, run_audit
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny
    from rlcurate.rollout import TransformersEngine
    from rlcurate.train.trainer import Trainer

    # a training run's environment.json (read by chapter 5 and by `rlcurate runs`)
    Trainer._write_environment(SimpleNamespace(device=torch.device("cpu"), out=tmp_path))
    env = json.loads((tmp_path / "environment.json").read_text())
    assert set(env) == KEYS and env["device"] == "cpu"
    # an audit's config.json: the record, and the keys its readers use
    model, tok = build_tiny_model(seed=0).eval(), build_tiny_tokenizer()
    config = AuditConfig(model="tiny", task_kwargs={"levels": ["add1"], "n_test": 2}, runs=2, max_new_tokens=3)
    run_audit(config, tmp_path / "audit", engine=TransformersEngine(model, tok), tokenizer=tok)
    info = json.loads((tmp_path / "audit" / "config.json").read_text())
    assert set(info["environment"]) == KEYS and info["environment"]["device"] == "cpu"
    assert info["versions"]["torch"] == env["torch"] and info["git_sha"] == env["git_sha"]
    assert info["device"].startswith("cpu (") and info["environment"]["cpu"] in info["device"]
    # a checkpoint's rlcurate.json
    save_tiny(model, tok, tmp_path / "ckpt", note="x")
    record = json.loads((tmp_path / "ckpt" / "rlcurate.json").read_text())
    assert set(record["environment"]) == KEYS and record["versions"]["torch"] == env["torch"]
    # a benchmark's result file
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "bench"))
    head = _common.header("test", threads=1)
    assert set(head["environment"]) == KEYS and head["git_sha"] == env["git_sha"]
    assert head["versions"]["torch"] == env["torch"] and head["machine"]["cpu"] == env["cpu"]
    assert head["machine"]["torch_threads"] == 1
