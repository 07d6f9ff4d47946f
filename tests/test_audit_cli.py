"""The ``rlcurate audit`` command line (chapter 4): a full run and ``--summarize`` on a random tiny
checkpoint, an audit over HTTP against ``python -m rlcurate.rollout.server`` (interrupted and
resumed), and bad input, which must give exit status 2 and a message that names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcurate.audit.cli import main
from rlcurate.audit.runner import RUNS_FILE, AuditConfig

NAME = "tiny-random"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    path = tmp_path_factory.mktemp("tiny-ckpt")
    save_tiny(build_tiny_model(dict(initializer_range=0.1), seed=0), build_tiny_tokenizer(), path)
    return path


def base_args(ckpt, out, *extra):
    return ["--model", str(ckpt), "--task", "arithmetic", "--task-kwargs", '{"levels": ["add1", "add2"], "n_test": 6}',
            "--runs", "3", "--limit", "10", "--max-new-tokens", "5", "--chunk-size", "4", "--quiet",
            "--out", str(out), *extra]


def test_audit_then_summarize(checkpoint, tmp_path, capsys):
    out = tmp_path / "a"
    assert main(base_args(checkpoint, out)) == 0
    printed = capsys.readouterr().out
    assert "10 samples x 3 runs (30 runs)" in printed and "advice" in printed
    for name in ("runs.jsonl", "config.json", "summary.json", "samples.jsonl", "mixed.jsonl", "variance.png",
                 "pass_rates.png", "sessions.jsonl"):
        assert (out / name).is_file(), name
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    assert main(["--summarize", str(out), "--no-plots"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again == first
    assert again["n_runs"] == 30 and again["config"]["runs"] == 3


def test_the_rlcurate_entry_point_delegates(tmp_path):
    res = subprocess.run([sys.executable, "-m", "rlcurate.cli", "audit", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--summarize" in res.stdout and "--backend" in res.stdout


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv_extra,match", [
    (["--task", "no_such_task"], "not a known task"),
    (["--task-kwargs", "{levels: 1}"], "--task-kwargs is not valid JSON"),
    (["--task-kwargs", "[1, 2]"], "--task-kwargs must be a JSON object"),
    (["--task-kwargs", '{"levels": ["add77"]}'], "add77"),
    (["--split", "dev"], "split"),
    (["--runs", "0"], "runs must be an integer >= 1"),
    (["--temperature", "-1"], "temperature"),
    (["--backend", "openai"], "base_url is required"),
])
def test_bad_arguments_exit_2_naming_them(checkpoint, tmp_path, capsys, argv_extra, match):
    assert main(base_args(checkpoint, tmp_path / "x") + argv_extra) == 2
    err = capsys.readouterr().err
    assert "rlcurate audit: error:" in err and match in err
    assert not (tmp_path / "x" / RUNS_FILE).exists()


def test_unknown_model_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "no-such-checkpoint"
    assert main(base_args(missing, tmp_path / "x")) == 2
    err = capsys.readouterr().err
    assert f"--model={str(missing)!r}: no such checkpoint directory" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before the audit folder is written


def test_a_folder_that_is_not_a_checkpoint_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(base_args(tmp_path / "empty", tmp_path / "x")) == 2
    assert "holds no config.json" in capsys.readouterr().err


def test_missing_out_and_model(capsys):
    assert main(["--model", "x"]) == 2 and "--out DIR is required" in capsys.readouterr().err
    assert main(["--out", "x"]) == 2 and "--model is required" in capsys.readouterr().err


def test_summarize_a_folder_that_is_not_an_audit(tmp_path, capsys):
    assert main(["--summarize", str(tmp_path)]) == 2
    assert "not an audit folder" in capsys.readouterr().err


def test_summarize_refuses_the_options_that_set_how_an_audit_runs(tmp_path, capsys):
    """``--summarize DIR`` reads the audit as it was run: --runs (at its default value too) or a sampling option
    is refused in one line naming them, before DIR is read; the summary's own options are accepted."""
    assert main(["--summarize", str(tmp_path), "--runs", "8", "--temperature", "1.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runs, --temperature set how an audit runs" in err, err
    assert main(["--summarize", str(tmp_path), "--runs", str(AuditConfig(model="x").runs)]) == 2
    assert "--runs set how an audit runs" in capsys.readouterr().err
    assert main(["--summarize", str(tmp_path), "--extra-runs", "3", "--group-size", "4", "--no-plots",
                 "--quiet"]) == 2
    assert "not an audit folder" in capsys.readouterr().err


def test_resuming_with_other_arguments_is_refused(checkpoint, tmp_path, capsys):
    out = tmp_path / "a"
    assert main(base_args(checkpoint, out)) == 0
    capsys.readouterr()
    assert main(base_args(checkpoint, out, "--seed", "5")) == 2
    assert "seed: 0 (recorded) != 5" in capsys.readouterr().err


def test_malformed_dataset_row_exits_2_naming_file_and_line(checkpoint, tmp_path, capsys):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    rows = [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}, {"question": "Q", "answer": "no marker"}]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--model", str(checkpoint), "--task", "gsm8k", "--task-kwargs", json.dumps({"data_dir": str(tmp_path / "data")}),
            "--out", str(tmp_path / "x"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "test.jsonl, line 2: field 'answer'" in err


# ---------------------------------------------------------------------------------------------- HTTP backend


@pytest.fixture(scope="module")
def server_url(checkpoint):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcurate.rollout.server", "--model", str(checkpoint), "--port", "0",
         "--served-model-name", NAME, "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if "http://" not in line:
            proc.kill()
            pytest.fail(f"server did not start: {line!r} {proc.stderr.read()[-2000:]}")
        yield line.strip().split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_http_backend_audit_resumes_exactly(checkpoint, server_url, tmp_path, capsys):
    http = ["--backend", "openai", "--base-url", server_url, "--model-name", NAME]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert main(base_args(checkpoint, full, *http)) == 0
    assert main(base_args(checkpoint, parts, *http, "--max-chunks", "1")) == 0
    assert "audit paused" in capsys.readouterr().err
    assert (parts / RUNS_FILE).read_text().count("\n") == 12
    assert main(base_args(checkpoint, parts, *http)) == 0
    a, b = (json.loads((d / "summary.json").read_text()) for d in (full, parts))
    a.pop("timing"), b.pop("timing")
    assert a == b and a["config"]["backend"] == "openai" and a["n_runs"] == 30
    assert sorted((full / RUNS_FILE).read_text().splitlines()) == sorted((parts / RUNS_FILE).read_text().splitlines())
    info = json.loads((full / "config.json").read_text())
    assert info["device"].startswith("server http://")


def test_a_model_name_the_server_does_not_serve_is_refused_before_the_audit_starts(checkpoint, server_url, tmp_path,
                                                                                      capsys):
    """Every request would fail (HTTP 404), and the folder would record the wrong name: refused in one line, nothing
    recorded, so the right name then runs in the same folder."""
    out = tmp_path / "audit"
    argv = base_args(checkpoint, out, "--backend", "openai", "--base-url", server_url, "--model-name", "wrong")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"model_name='wrong': the server at {server_url} serves '{NAME}'; pass --model-name" in err, err
    assert len(err.strip().splitlines()) == 1 and not (out / "config.json").exists()
    assert main(base_args(checkpoint, out, "--backend", "openai", "--base-url", server_url, "--model-name", NAME,
                          "--max-chunks", "1")) == 0


def test_http_backend_server_down_stops_cleanly(checkpoint, tmp_path, capsys):
    argv = base_args(checkpoint, tmp_path / "down", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1",
                     "--model-name", NAME)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot reach" in err and "run the same command again to resume" in err
