"""Checks on the values recorded by book/A1_benchmarks.ipynb (run in the smoke profile). Timings are
never asserted on (they belong to the machine); the numerical checks and the formulas are."""

import math


def check(records):
    shared = records["shared_forward"]
    assert shared["max_abs_diff"] < 1e-5 and shared["grad_rel"] < 1e-5
    assert 0.3 < shared["positions_ratio"] < 1.0  # sharing prompts removes token positions
    assert records["qwen25_05b_params"] == 494_032_768
    for name, c in records["ceilings"].items():
        dec = c["decode"]
        assert all(a < b for a, b in zip(dec, dec[1:])), name
        assert math.isclose(c["train"], 989e12 / (6 * 494_032_768), rel_tol=1e-9)
    # the stored results, when present, are ratios in a sane range (not a speed claim)
    for key, r in records["step_ratios"].items():
        assert 0.05 < r["wall"] < 5 and 0.05 < r["cpu"] < 5, key
    if records["audit"] is not None:
        assert records["audit"]["samples_per_s"] > 0
    for ratio in records["forced_run_ratios"]:  # every stored forced-length run, same sanity range
        assert 0.05 < ratio < 5
    # issue #17: the planner's activation formula against the H100's measurement, and its verdicts
    for model, m in (records.get("memory_per_token") or {}).items():
        assert abs(m["predicted"] / m["measured"] - 1) < 0.15, model
    plans = records["gpu_plans"]
    assert len(plans) >= 8 and all(p["fits"] and p["peak_gib"] < 78 and p["gpu_hours"] > 0 for p in plans.values())
    assert all(h > 0 for h in records["gpu_suite_hours"].values()) and len(records["gpu_suite_hours"]) >= 3
    # the chapters' GPU cells ran through in a dry run; the decode paths (when measured) agree on tokens
    if records["dryrun_chapters"]:
        assert all(r["passed"] and r["seconds"] > 0 for r in records["dryrun_chapters"].values())
        assert len(records["dryrun_chapters"]) >= 7
    for name, r in records["decode_paths"].items():
        assert r["tokens_per_s"] > 0 and r["time_over_dynamic"] > 0, name
    # issue #31: the H200's captured and compiled steps (stored results), as the text reads them: the captured
    # step under half the eager step's time at every batch size and at most 8 ms at 256 rows; the compiled one
    # at most 8 ms and at least 4 times faster than eager there
    gpu = records.get("gpu_decode_paths") or {}
    if gpu:
        captured = {k: v for k, v in gpu.items() if not k.startswith("compiled")}
        assert len(captured) == 9 and all(v["ratio"] < 0.5 for v in captured.values())
        assert all(v["captured_ms"] <= 8 for k, v in captured.items() if k.split()[0].endswith("/256"))
        assert gpu["compiled/256"]["compiled_ms"] <= 8 and gpu["compiled/256"]["ratio"] <= 0.25
