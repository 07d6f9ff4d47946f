"""Bad inputs to the variance audit (chapter 4; issue #12, "the audit says what invalidates it").

Each test is one row of the bad-inputs table: what the user did, what the command prints, and that
nothing ends in a traceback, a silent wrong result or lost work. Command-line errors must exit with
status 2 and print exactly one line that names the input; an audit that stops early must keep every
finished batch and resume.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlcurate.audit import AuditConfig, format_summary, load_audit, read_runs, run_audit, summarize
from rlcurate.audit import runner as runner_mod
from rlcurate.audit import store as store_mod
from rlcurate.audit.runner import CONFIG_FILE, FORMAT, RUNS_FILE, SESSIONS_FILE, sub_batches
from rlcurate.cli import main as rlcurate
from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.rollout import TransformersEngine

REPO = Path(__file__).resolve().parents[1]
SPREAD = REPO / "data" / "tiny" / "spread"
TASK_KW = {"levels": ["add1", "add2"], "n_test": 6}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from rlcurate.models.tiny import save_tiny

    path = tmp_path_factory.mktemp("tiny-ckpt")
    save_tiny(build_tiny_model(dict(initializer_range=0.1), seed=0), build_tiny_tokenizer(), path)
    return path


@pytest.fixture(scope="module")
def engine():
    return TransformersEngine(build_tiny_model(dict(initializer_range=0.1), seed=0).eval(), build_tiny_tokenizer())


def argv(ckpt, out, *extra):
    return ["audit", "--model", str(ckpt), "--task", "arithmetic", "--task-kwargs", json.dumps(TASK_KW),
            "--runs", "3", "--limit", "8", "--max-new-tokens", "5", "--chunk-size", "4", "--quiet", "--no-plots",
            "--out", str(out), *extra]


def one_error_line(capsys, *names, after_loading: bool = False) -> str:
    """The CLI's error output: exactly one non-empty line, no traceback, naming every one of ``names``.
    ``after_loading``: the model was loaded, so progress bars share stderr; only they may be around it."""
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    if after_loading:
        lines = [x for x in err.splitlines() if x.startswith("rlcurate ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def parity(problem, text):
    return float(ord(text[0]) % 2) if text else 0.0


def cfg(**kw):
    base = dict(model="tiny-random", task="arithmetic", task_kwargs=TASK_KW, runs=4, limit=8, chunk_size=8,
                max_new_tokens=6, seed=1)
    base.update(kw)
    return AuditConfig(**base)


def fake_audit(out: Path, scores, finish=None, reasons=None, **config) -> None:
    """An audit folder holding the given score matrix (and finish reasons / reasons per run)."""
    out.mkdir(parents=True, exist_ok=True)
    runs = len(scores[0])
    c = cfg(runs=runs, limit=len(scores), **config).to_dict()
    uids = [f"s{i}" for i in range(len(scores))]
    (out / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, "config": c, "samples": uids,
                                               "n_samples": len(scores)}))
    lines = []
    for i, row in enumerate(scores):
        for j, s in enumerate(row):
            lines.append(json.dumps({"index": i, "uid": uids[i], "run": j, "score": float(s),
                                     "reason": reasons[i][j] if reasons else "", "completion": "x", "n_tokens": 3,
                                     "finish_reason": finish[i][j] if finish else "stop"}))
    (out / RUNS_FILE).write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------- what invalidates


def test_a_reward_function_failing_on_every_run_is_the_verdict(engine, tmp_path):
    def broken(problem, text):
        raise KeyError("answer")

    run_audit(cfg(), tmp_path, engine=engine, tokenizer=engine.tokenizer, reward_fn=broken)
    s = summarize(tmp_path)
    assert s["reward_errors"]["runs"] == 32 and s["reward_errors"]["share"] == 1.0
    text = format_summary(s).splitlines()
    assert text[1].startswith("  verdict: the audit measures the reward function, not the data: it failed on 32 "
                              "of 32 runs (100.0%)") and "KeyError" in text[1]
    assert s["advice"] is None and "  advice: none on the data until the verdict's problem is fixed" in text
    assert not any("too easy or too hard" in x or "mixed groups by group size" in x for x in text)


def test_nan_rewards_count_as_reward_errors(engine, tmp_path):
    run_audit(cfg(), tmp_path, engine=engine, tokenizer=engine.tokenizer, reward_fn=lambda p, t: float("nan"))
    recs = read_runs(tmp_path / RUNS_FILE)[0]
    assert all(r["reward_error"] and r["score"] == 0.0 and "nan" in r["reason"] for r in recs)
    assert summarize(tmp_path)["verdict"]["code"] == "reward_errors"


def test_rewards_outside_0_1_count_as_reward_errors(engine, tmp_path):
    run_audit(cfg(), tmp_path, engine=engine, tokenizer=engine.tokenizer, reward_fn=lambda p, t: 5.0)
    recs = read_runs(tmp_path / RUNS_FILE)[0]
    assert all(r["reward_error"] and "outside [0, 1]" in r["reason"] for r in recs)


def test_a_task_verifier_that_fails_counts_as_a_reward_error(engine, tmp_path, monkeypatch):
    from rlcurate.tasks import get_task

    task = get_task("arithmetic", **TASK_KW)

    def explode(problem, completion):
        raise RuntimeError("math-verify is not installed")

    monkeypatch.setattr(task, "_score", explode)  # Task.reward turns it into "verifier error: ..."
    run_audit(cfg(), tmp_path, engine=engine, tokenizer=engine.tokenizer, task=task)
    s = summarize(tmp_path)
    assert s["reward_errors"]["runs"] == 32 and "verifier error: RuntimeError" in s["reward_errors"]["first"]
    assert s["verdict"]["code"] == "reward_errors"


def test_runs_cut_off_by_the_token_limit_are_the_verdict(checkpoint, tmp_path, capsys):
    assert rlcurate(argv(checkpoint, tmp_path / "a", "--max-new-tokens", "2")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  verdict: the audit measures the token limit, not the data: 24 of 24 runs "
                             "(100.0%) hit max_new_tokens=2 and failed; raise --max-new-tokens")
    assert not any("too easy or too hard" in x for x in out)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["truncation"]["runs"] == 24 and s["advice"] is None


def test_old_audits_without_error_flags_still_count_errors(tmp_path):
    reasons = [["reward error: KeyError: 'x'"] * 3, ["exact match"] * 3, ["verifier error: boom"] * 3]
    fake_audit(tmp_path, [[0, 0, 0], [1, 1, 1], [0, 0, 0]], reasons=reasons)
    s = summarize(tmp_path)
    assert s["reward_errors"]["runs"] == 6 and s["reward_errors"]["first"] == "reward error: KeyError: 'x'"


def test_truncated_runs_that_succeed_do_not_invalidate(tmp_path):
    finish = [["length"] * 4] * 10
    rows = [[1, 1, 1, 1]] * 4 + [[1, 0, 1, 0]] * 3 + [[0, 0, 0, 1]] * 3
    fake_audit(tmp_path, rows, finish=finish)
    s = summarize(tmp_path)
    assert s["truncation"]["share"] == 1.0 and s["truncation"]["failed_share"] == pytest.approx(15 / 40)
    assert s["verdict"]["code"] == "truncation"
    fake_audit(tmp_path / "b", [[1, 1, 1, 1]] * 4 + [[1, 0, 1, 1]] * 6, finish=finish)
    s = summarize(tmp_path / "b")
    assert s["truncation"]["failed_share"] == pytest.approx(6 / 40) and s["verdict"]["code"] == "truncation"
    fake_audit(tmp_path / "c", [[1, 1, 1, 1]] * 8 + [[1, 0, 1, 1]] * 2, finish=finish)
    assert summarize(tmp_path / "c")["verdict"]["code"] != "truncation"  # 2 of 40 failed: 5%


# ---------------------------------------------------------------------------------------------- uncertainty


def test_a_share_whose_interval_straddles_the_threshold_says_it_cannot_tell(tmp_path):
    fake_audit(tmp_path, [[1, 0, 1]] * 2 + [[0, 0, 0]] * 18)  # 10% mixed of 20: interval about 3-30%
    s = summarize(tmp_path)
    assert s["mixed_share"]["low"] < 0.10 < s["mixed_share"]["high"]
    assert s["verdict"]["code"] == "uncertain"
    line = format_summary(s).splitlines()[1]
    assert line.startswith("  verdict: cannot tell whether fewer than 10% of the prompts are mixed in 3 runs")
    fake_audit(tmp_path / "few", [[1, 0, 1]] * 2 + [[0, 0, 0]] * 98)
    assert summarize(tmp_path / "few")["verdict"]["code"] == "few_mixed"


@pytest.mark.parametrize("rows,why", [
    ([[1, 1, 1, 1]] * 6 + [[0, 0, 0, 0]] * 6, "pile up at 0 and 1"),
    ("alike", "all prompts alike"),
], ids=["polar", "alike"])
def test_degenerate_prior_fits_are_reported_as_degenerate(tmp_path, rows, why):
    if rows == "alike":
        k = np.random.default_rng(0).binomial(4, 0.25, size=80)
        rows = [[1] * int(j) + [0] * (4 - int(j)) for j in k]
    fake_audit(tmp_path, rows)
    s = summarize(tmp_path)
    assert why in s["reliability"]["prior"]["degenerate"]
    text = format_summary(s)
    assert "fitted prior: degenerate (" in text and "Beta(" not in text
    assert "uniform_share_of_truly_mixed" not in s["reliability"]
    # the gate beyond the audit's runs comes from the Beta mixture (rlcurate advise's fit), which a degenerate
    # single Beta does not stop; with no mixed prompt at all there is nothing between 0 and 1 to fit
    g = s["gate"]["by_group_size"]
    if why == "pile up at 0 and 1":
        assert {v["source"] for k_, v in g.items() if int(k_) > 4} == {None} and "disagree" in s["gate"]["no_fit"]
        assert "re-audit the uniform prompts" in s["advice"]["text"]
    else:  # p near 0.25 for every prompt: 1 - 0.75^8 - 0.25^8 of the groups of 8 mix
        assert {v["source"] for k_, v in g.items() if int(k_) > 4} == {"fit"} and s["gate"]["no_fit"] is None
        assert g["8"]["share"] == pytest.approx(1 - 0.75**8 - 0.25**8, abs=0.05)
        assert "(Beta-mixture fit)" in text


def test_graded_scores_are_measured_but_not_extrapolated(tmp_path):
    """The mixture models pass/fail rewards; with graded scores the gate is measured up to the audit's runs (two
    different scores open it) and not extrapolated beyond, and the advice says why."""
    rows = [[1, 0.5, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0.5, 0.5, 0, 1]] * 6
    fake_audit(tmp_path, rows)
    s = summarize(tmp_path)
    g = s["gate"]["by_group_size"]
    assert g["4"] == {"share": 0.5, "source": "measured"} and g["8"] == {"share": None, "source": None}
    assert "graded" in s["gate"]["no_fit"] and "graded" in s["advice"]["text"]


def test_the_advice_is_keyed_on_the_gate_and_the_group_size(tmp_path, capsys):
    rows = [[1, 0, 0, 0, 0, 0, 0, 0]] * 5 + [[0] * 8] * 10 + [[1, 1, 0, 1, 0, 1, 1, 0]] * 5
    fake_audit(tmp_path, rows)
    assert rlcurate(["audit", "--summarize", str(tmp_path), "--no-plots", "--group-size", "4"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    a = s["advice"]
    assert (a["group_size"], a["doubled"], a["source"], a["source_doubled"]) == (4, 8, "measured", "measured")
    assert a["share_doubled"] == pytest.approx(10 / 20)  # at G = N the measured share is the mixed share
    assert a["per_100_rollouts_doubled"] < a["per_100_rollouts"]  # never more signal per rollout (chapter 1)
    assert "multiplier" not in json.dumps(s)
    assert "groups of 8 would make 50.0% mixed (measured)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- bad flags


def test_runs_1_is_said_plainly(checkpoint, tmp_path, capsys):
    assert rlcurate(argv(checkpoint, tmp_path / "a", "--runs", "1")) == 0
    cap = capsys.readouterr()
    assert "--runs 1 cannot tell mixed prompts from uniform ones" in cap.err and "Traceback" not in cap.err
    out = cap.out.splitlines()
    assert out[1].startswith("  verdict: ") and "1 run per sample cannot tell mixed prompts from uniform ones" in out[1]
    assert "mixed cannot show with 1 run" in out[2]
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert "one_run" in s["verdict"]["problems"] and s["advice"] is None and s["reliability"]["prior"] is None


@pytest.mark.parametrize("value", ["5", "0", "-1", "nan"])
def test_a_success_threshold_outside_the_reward_range_is_refused(checkpoint, tmp_path, capsys, value):
    assert rlcurate(argv(checkpoint, tmp_path / "a", "--success-threshold", value)) == 2
    one_error_line(capsys, "--success-threshold", "(0, 1]")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("extra,names", [
    (["--task-kwargs", "{levels: 1}"], ["--task-kwargs", "not valid JSON"]),
    (["--task-kwargs", "[1]"], ["--task-kwargs must be a JSON object, got '[1]'"]),
    # the task error repeats the task arguments first: the names below are the message proper
    (["--task-kwargs", '{"colour": "red"}'], ["task 'arithmetic' does not take colour; it takes "]),
    (["--task-kwargs", '{"levels": ["add77"]}'], ["level must look like 'add3' or 'mul2x1', got 'add77'"]),
    (["--group-size", "1"], ["--group-size must be >= 2 (a group of 1 is never mixed), got 1"]),
], ids=["not-json", "not-object", "unknown-key", "bad-level", "group-size-1"])
def test_bad_task_kwargs_and_group_size_are_named(checkpoint, tmp_path, capsys, extra, names):
    assert rlcurate(argv(checkpoint, tmp_path / "a", *extra)) == 2
    one_error_line(capsys, *names)
    assert not (tmp_path / "a" / RUNS_FILE).exists()


# ---------------------------------------------------------------------------------------------- data files


def gsm8k_dir(tmp_path, second_line: bytes) -> Path:
    d = tmp_path / "data" / "gsm8k"
    d.mkdir(parents=True)
    good = json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}).encode()
    (d / "test.jsonl").write_bytes(good + b"\n" + second_line + b"\n")
    return tmp_path / "data"


@pytest.mark.parametrize("line,what", [
    (b'{"question": "Q", "answer": ', "not valid JSON"),
    (b'["a list"]', "expected a JSON object"),
    ('{"question": "Caf\xe9", "answer": "#### 4"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9"),
], ids=["invalid-json", "json-list", "latin-1"])
def test_malformed_or_non_utf8_data_files_name_file_and_line(checkpoint, tmp_path, capsys, monkeypatch, line, what):
    data = gsm8k_dir(tmp_path, line)
    monkeypatch.setattr(runner_mod, "make_engine", lambda c: pytest.fail("the model was loaded"))
    args = ["audit", "--model", str(checkpoint), "--task", "gsm8k", "--task-kwargs",
            json.dumps({"data_dir": str(data)}), "--quiet", "--out", str(tmp_path / "x")]
    assert rlcurate(args) == 2
    one_error_line(capsys, "test.jsonl, line 2", what)


# ---------------------------------------------------------------------------------------------- audit folders


def test_summarize_a_folder_that_is_not_an_audit(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert rlcurate(["audit", "--summarize", str(tmp_path)]) == 2
    one_error_line(capsys, "config.json", "is not an audit folder")
    (tmp_path / CONFIG_FILE).write_text('{"format": "something else"}')
    assert rlcurate(["audit", "--summarize", str(tmp_path)]) == 2
    one_error_line(capsys, "config.json", "not an rlcurate audit config")


def test_summarize_an_audit_with_a_corrupted_line(tmp_path, capsys):
    fake_audit(tmp_path, [[1, 0], [0, 0]])
    with open(tmp_path / RUNS_FILE, "ab") as f:
        f.write(b"\xff\xfe garbage\n")
    assert rlcurate(["audit", "--summarize", str(tmp_path), "--no-plots"]) == 2
    one_error_line(capsys, "runs.jsonl, line 5", "not valid JSON")


def test_an_out_folder_that_cannot_be_created_is_refused_before_loading(checkpoint, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setattr(runner_mod, "make_engine", lambda c: pytest.fail("the model was loaded"))
    assert rlcurate(argv(checkpoint, tmp_path / "file" / "audit")) == 2
    line = one_error_line(capsys, "cannot write to", str(tmp_path / "file" / "audit"))
    assert "run the same command again" not in line


def test_a_read_only_out_folder_is_refused_before_loading(checkpoint, tmp_path, capsys, monkeypatch):
    """As root a chmod does not stop writes, so files in the folder refuse to open, as on a read-only mount."""
    out = tmp_path / "ro"
    out.mkdir()
    real_open = open

    def read_only(path, mode="r", *a, **k):
        if str(path).startswith(str(out)) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(store_mod, "open", read_only, raising=False)  # the module that writes the folder
    monkeypatch.setattr(runner_mod, "make_engine", lambda c: pytest.fail("the model was loaded"))
    assert rlcurate(argv(checkpoint, out)) == 2
    one_error_line(capsys, f"cannot write to {out}", "Read-only file system")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["disk-full", "read-only"])
def test_disk_full_or_read_only_during_an_audit_keeps_finished_batches(checkpoint, tmp_path, capsys, monkeypatch,
                                                                       code):
    out, clean = tmp_path / "a", tmp_path / "clean"
    real = runner_mod._append_lines
    calls = {"runs": 0}

    def fails_on_the_third_batch(path, lines):
        if Path(path).name == RUNS_FILE:
            calls["runs"] += 1
            if calls["runs"] == 3:
                raise OSError(code, os.strerror(code), str(path))
        return real(path, lines)

    monkeypatch.setattr(runner_mod, "_append_lines", fails_on_the_third_batch)
    one_sample = ["--token-budget", "40"]  # batches of one sample (3 runs each)
    assert rlcurate(argv(checkpoint, out, *one_sample)) == 1
    line = one_error_line(capsys, f"cannot write {out / RUNS_FILE}", os.strerror(code),
                          "the 6 runs finished before it are saved", "run the same command again to resume",
                          after_loading=True)
    assert "Traceback" not in line and len(read_runs(out / RUNS_FILE)[0]) == 6
    session = json.loads((out / SESSIONS_FILE).read_text().splitlines()[-1])
    assert "cannot write" in session["stopped"] and session["new_runs"] == 6
    monkeypatch.setattr(runner_mod, "_append_lines", real)
    assert rlcurate(argv(checkpoint, out, *one_sample)) == 0 and rlcurate(argv(checkpoint, clean, *one_sample)) == 0
    capsys.readouterr()
    assert sorted((out / RUNS_FILE).read_text().splitlines()) == sorted((clean / RUNS_FILE).read_text().splitlines())


def test_a_summary_that_cannot_be_written_says_so(tmp_path, capsys, monkeypatch):
    fake_audit(tmp_path, [[1, 0], [0, 0]])

    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    assert rlcurate(["audit", "--summarize", str(tmp_path), "--no-plots"]) == 2
    one_error_line(capsys, f"cannot write {tmp_path / 'summary.json'}", "Permission denied", "runs are saved")


# ---------------------------------------------------------------------------------------------- progress, signals


def test_sub_batches_fit_the_token_budget():
    assert sub_batches([10, 10, 10, 10], runs=4, max_new_tokens=6, token_budget=128) == [[0, 1], [2, 3]]
    assert sub_batches([10, 30, 10], runs=2, max_new_tokens=10, token_budget=100) == [[0], [1], [2]]
    assert sub_batches([5] * 5, runs=1, max_new_tokens=5, token_budget=10**6) == [[0, 1, 2, 3, 4]]
    assert sub_batches([500], runs=8, max_new_tokens=64, token_budget=100) == [[0]]  # too big: alone


def test_progress_is_saved_inside_a_chunk(engine, tmp_path):
    """One chunk of 8 samples in batches of 2 (a small token budget, as for a large model): a kill in the
    third generation call leaves two batches on disk, and the resumed audit equals an uninterrupted one."""

    class KilledOnThirdCall:
        def __init__(self):
            self.calls, self.tokenizer = 0, engine.tokenizer

        def generate(self, prompts, n, params, seed=0):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return engine.generate(prompts, n, params, seed=seed)

    c = cfg(chunk_size=8, token_budget=2 * 4 * (12 + 6))  # prompts of the add levels are < 12 tokens
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    with pytest.raises(KeyboardInterrupt):
        run_audit(c, killed, engine=KilledOnThirdCall(), tokenizer=engine.tokenizer, reward_fn=parity)
    recs = read_runs(killed / RUNS_FILE)[0]
    assert len(recs) == 16 and sorted({r["index"] for r in recs}) == [0, 1, 2, 3]
    session = json.loads((killed / SESSIONS_FILE).read_text())
    assert session["batches"] == 2 and session["chunks"] == 0 and "interrupted" in session["stopped"]
    again = run_audit(c, killed, engine=engine, tokenizer=engine.tokenizer, reward_fn=parity)
    assert again["new_runs"] == 16 and again["batches"] == 2 and again["resume_mismatches"] == 0
    run_audit(c, clean, engine=engine, tokenizer=engine.tokenizer, reward_fn=parity)
    assert sorted(map(json.dumps, read_runs(killed / RUNS_FILE)[0])) == \
        sorted(map(json.dumps, read_runs(clean / RUNS_FILE)[0]))


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_is_recorded(checkpoint, tmp_path, capsys):
    ckpt, max_new = (SPREAD, 48) if (SPREAD / "config.json").is_file() else (checkpoint, 24)
    out = tmp_path / "a"
    args = ["audit", "--model", str(ckpt), "--task", "arithmetic", "--runs", "4", "--limit", "120",
            "--max-new-tokens", str(max_new), "--chunk-size", "120", "--token-budget", "1200", "--threads", "1",
            "--quiet", "--no-plots", "--out", str(out)]
    cmd = [sys.executable, "-m", "rlcurate", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    runs = out / RUNS_FILE
    try:
        while not (runs.exists() and runs.stat().st_size > 0):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no batch written: rc={proc.poll()} {proc.stderr.read()[-2000:]}")
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert "terminated by SIGTERM" in err and "run the same command again to resume" in err
    assert "Traceback" not in err
    raw = runs.read_bytes()
    assert raw.endswith(b"\n")  # no half-written batch
    done = len(read_runs(runs)[0])
    total = 4 * json.loads((out / CONFIG_FILE).read_text())["n_samples"]
    assert 0 < done < total and done % 4 == 0
    session = json.loads((out / SESSIONS_FILE).read_text().splitlines()[-1])
    assert session["stopped"] == "SIGTERM" and session["new_runs"] == done
    assert rlcurate(args) == 0  # resumes
    assert len(read_runs(runs)[0]) == total and load_audit(out).complete
    assert json.loads((out / SESSIONS_FILE).read_text().splitlines()[-1])["runs_before"] == done


# ---------------------------------------------------------------------------------------------- the export


def test_the_mixed_export_carries_question_answer_and_split(engine, tmp_path):
    run_audit(cfg(), tmp_path, engine=engine, tokenizer=engine.tokenizer, reward_fn=parity)
    from rlcurate.audit import write_summary

    write_summary(tmp_path, plots=False)
    rows = [json.loads(x) for x in (tmp_path / "mixed.jsonl").read_text().splitlines()]
    assert rows, "the parity reward gives mixed samples"
    for r in rows:
        assert r["split"] == "test" and r["task"] == "arithmetic"
        assert r["question"].endswith("=") and r["answer"].lstrip("-").isdigit()
        assert r["question"].startswith(r["uid"].split(":")[1].rstrip("=")[:1])


def test_a_test_split_export_fed_to_prefilter_says_to_audit_the_train_split(tmp_path, capsys):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"uid": f"add:{i}+{i}", "mean": 0.5, "n_runs": 4, "split": "test",
                                         "question": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(3)))
    config = REPO / "configs" / "tiny_uniform.yaml"
    args = ["train", "--config", str(config), "--set", "strategy=prefilter", "--set",
            f"strategy_kwargs={{audit_file: {mixed}}}", "--set", f"out_dir={tmp_path / 'run'}", "--set", "steps=1",
            "--set", "threads=1"]
    assert rlcurate(args) == 2
    line = one_error_line(capsys, str(mixed), "'test' split", "--split train", after_loading=True)
    assert line.startswith("rlcurate train: error: prefilter: no uid of ")


def test_a_resume_after_the_model_at_the_path_was_replaced_is_refused(checkpoint, tmp_path):
    """The audit records a hash of the checkpoint's weight files; a resume whose weights differ is refused
    instead of mixing two models in one summary (issue #30; before: a warning blaming float rounding)."""
    import shutil

    from rlcurate.audit import AuditConfig, AuditError, run_audit
    from rlcurate.models.tiny import save_tiny

    model = tmp_path / "model"
    shutil.copytree(checkpoint, model)
    config = AuditConfig(model=str(model), task="arithmetic", task_kwargs=TASK_KW, runs=2, limit=8,
                         max_new_tokens=5, chunk_size=4)
    out = tmp_path / "audit"
    run_audit(config, out, max_chunks=1)
    recorded = json.loads((out / "config.json").read_text())["weights_sha256"]
    assert len(recorded) == 64
    save_tiny(build_tiny_model(dict(initializer_range=0.1), seed=1), build_tiny_tokenizer(), model)  # replaced
    with pytest.raises(AuditError, match="are not those this audit began with"):
        run_audit(config, out)
    save_tiny(build_tiny_model(dict(initializer_range=0.1), seed=0), build_tiny_tokenizer(), model)  # put back
    assert run_audit(config, out)["complete"]
