"""The CPU-safe parts of the benchmarks (appendix A1): the hardware-limit formulas of
``bench/bench_gpu_throughput.py``, the timing statistics and the result files. The appendix notebook itself is
executed in the smoke profile by ``tests/test_notebooks.py``, which checks its records (``chapter_checks/A1_benchmarks.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import _common  # noqa: E402
import bench_gpu_throughput as gpu  # noqa: E402


def test_qwen25_05b_architecture_has_the_published_parameter_count():
    cfg = gpu.qwen_config()
    assert gpu.count_params(cfg) == gpu.QWEN25_05B_PARAMS == 494_032_768
    # 24 layers x 2 KV heads x head_dim 64 x (K and V) x 2 bytes
    assert gpu.kv_bytes_per_token(cfg, 2) == 2 * 24 * 2 * 64 * 2 == 12_288


def test_decode_limit():
    W, kv, bw = 1e9, 1e4, 2e12
    # batch 1, empty cache: one step reads the weights once
    assert gpu.decode_limit_tokens_per_s(W, kv, 1, 0, bw) == pytest.approx(bw / W)
    assert gpu.decode_step_bytes(W, kv, 8, 100) == W + 8 * 100 * kv
    limits = [gpu.decode_limit_tokens_per_s(W, kv, b, 384, bw) for b in (1, 8, 64, 512, 4096, 10**7)]
    assert all(a < b for a, b in zip(limits, limits[1:]))  # batching amortises the weights ...
    assert limits[-1] < bw / (384 * kv)  # ... up to the KV cache's own ceiling
    assert limits[-1] == pytest.approx(bw / (384 * kv), rel=1e-2)


def test_train_limit():
    assert gpu.train_limit_tokens_per_s(494_032_768, 989e12) == pytest.approx(989e12 / (6 * 494_032_768))
    # an H100's dense bf16 rate bounds 0.5B-parameter training near 334k tokens/s
    assert 3.3e5 < gpu.train_limit_tokens_per_s(gpu.QWEN25_05B_PARAMS, 989e12) < 3.4e5


def test_summary_and_paired_ratio():
    s = _common.summary([3.0, 1.0, 2.0, 4.0])
    assert s["median_s"] == 2.5 and s["min_s"] == 1.0 and s["max_s"] == 4.0 and s["n"] == 4
    r = _common.paired_ratio([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert r["ratio_of_medians"] == 0.5 and r["median_paired_ratio"] == 0.5
    calls = []
    times = _common.interleaved([lambda: calls.append("a"), lambda: calls.append("b")], repeats=2, warmup=1)
    assert calls == ["a", "b"] * 3 and [len(t) for t in times] == [2, 2]


@pytest.mark.parametrize("name", ["trl_step.json", "generate.json", "audit.json", "trl_skip.json"])
def test_result_files_record_versions_machine_and_date(name):
    path = REPO / "data" / "bench" / name
    if not path.exists():
        pytest.skip(f"{path} has not been produced (run the script in bench/ that writes it)")
    rec = json.loads(path.read_text())
    for key in ("what", "date", "versions", "machine", "ratio"):
        assert key in rec, f"{name} lacks {key!r}"
    assert rec["versions"]["torch"] and rec["machine"]["cpu"]
    # every ratio the file states is the ratio of the medians it records (rounded to 4 digits as written)
    pairs = {"trl_step.json": [(rec.get("rlcurate"), rec.get("trl"), rec.get("rlcurate_over_trl"), "step")],
             "audit.json": [(rec.get("audit"), rec.get("bare"), rec.get("audit_over_bare"), None)],
             "generate.json": [(r["engine"], r["generate"], r["engine_over_generate"], None) for r in rec.get("results", [])],
             "trl_skip.json": [(rec.get("packed_total"), rec.get("dense_total"), rec.get("packed_over_dense"), None)]
             + [(b["packed"], b["dense"], b["packed_over_dense"], None) for b in rec.get("generation_batches", [])]}[name]
    assert pairs and all(num and den and ratio for num, den, ratio in (p[:3] for p in pairs)), f"{name}: no timed pair"
    for num, den, ratio, key in pairs:
        num, den = (num[key], den[key]) if key else (num, den)
        assert ratio["ratio_of_medians"] == pytest.approx(num["median_s"] / den["median_s"], abs=6e-4)
        q1, q3 = ratio["paired_ratio_q1_q3"]
        assert q1 <= ratio["median_paired_ratio"] <= q3 and num["min_s"] <= num["median_s"] <= num["max_s"]



def test_the_trl_skip_benchmark_timed_the_same_gradient():
    path = REPO / "data" / "bench" / "trl_skip.json"
    if not path.exists():
        pytest.skip(f"{path} has not been produced (bench/bench_trl_skip.py writes it)")
    batches = json.loads(path.read_text())["generation_batches"]
    assert batches and all(b["max_abs_gradient_difference"] <= 1e-5 * b["max_abs_gradient"]
                           for b in batches)
    assert sum(b["rows_dropped"] for b in batches) > 0

def test_the_make_test_timing_reads_a_logs_counts_and_slowest_tests():
    """bench/time_make_test.py reads what ``make test --durations`` prints, and refuses a log without a summary."""
    spec = importlib.util.spec_from_file_location("time_make_test", REPO / "bench" / "time_make_test.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    log = ("============================= slowest 40 durations =============================\n"
           "98.24s call     tests/test_notebooks.py::test_chapter_executes_and_records[07_hinting]\n"
           "40.25s setup    tests/test_interop_verl_current.py::test_registered\n"
           "========== 1796 passed, 6 skipped, 15 warnings in 1034.95s (0:17:14) ===========\n")
    r = bench.parse(log)
    assert (r["passed"], r["skipped"], r["failed"], r["pytest_seconds"]) == (1796, 6, 0, 1034.95)
    assert [(s["seconds"], s["phase"]) for s in r["slowest"]] == [(98.24, "call"), (40.25, "setup")]
    assert bench.parse("===== 1 failed, 1795 passed, 6 skipped, 15 warnings in 1042.99s (0:17:22) =====")["failed"] == 1
    with pytest.raises(SystemExit, match="no pytest summary"):
        bench.parse("make: *** [Makefile:65: test] Error 1\n")
