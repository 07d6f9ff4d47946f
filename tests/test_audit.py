"""Tests of the variance audit (chapter 4): the runner on a seeded random tiny model (files, resume,
determinism, failing reward functions, config checks) and the summary on hand-made score files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlcurate.audit import (AuditConfig, AuditError, AuditStopped, audit_order, beta_uniform_prob, chunk_seed,
                            load_audit, read_runs, run_audit, summarize, write_summary)
from rlcurate.audit.plots import plot_pass_rate_hist, plot_variance, plot_zero_variance
from rlcurate.audit.runner import CONFIG_FILE, FORMAT, RUNS_FILE, SESSIONS_FILE
from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.rollout import TransformersEngine
from rlcurate.stats import fit_beta_prior, pass_at_k_curve
from rlcurate.stats.mixture import fit_beta_mixture

TASK_KW = {"levels": ["add1", "add2", "mul1"], "n_test": 8}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(dict(initializer_range=0.1), seed=0).eval()
    return TransformersEngine(model, tok)


def parity_reward(problem, text):
    """A reward with pass rates strictly between 0 and 1 for a random model: the parity of the first
    character's code point."""
    return float(ord(text[0]) % 2) if text else 0.0


def config(**kw):
    base = dict(model="tiny-random", task="arithmetic", task_kwargs=TASK_KW, runs=4, limit=12, chunk_size=5,
                max_new_tokens=6, seed=3)
    base.update(kw)
    return AuditConfig(**base)


def audit(engine, out, cfg=None, **kw):
    return run_audit(cfg or config(), out, engine=engine, tokenizer=engine.tokenizer, reward_fn=parity_reward, **kw)


def lines_of(out: Path) -> list[dict]:
    return read_runs(out / RUNS_FILE)[0]


def without_timing(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "timing"}


# ---------------------------------------------------------------------------------------------- order, seeds


def test_audit_order_is_a_prefix_stable_permutation():
    full = audit_order(50, config(limit=None))
    assert sorted(full.tolist()) == list(range(50)) and full.tolist() != list(range(50))
    assert audit_order(50, config(limit=10)).tolist() == full[:10].tolist()
    assert audit_order(50, config(limit=10, shuffle=False)).tolist() == list(range(10))
    assert audit_order(50, config(subset_seed=1, limit=None)).tolist() != full.tolist()
    # the sampling seed does not change which samples are audited
    assert audit_order(50, config(seed=99, limit=None)).tolist() == full.tolist()


def test_chunk_seeds_are_distinct_and_deterministic():
    seeds = [chunk_seed(0, c) for c in range(1000)] + [chunk_seed(1, c) for c in range(1000)]
    assert len(set(seeds)) == 2000 and all(0 <= s < 2**63 for s in seeds)
    # pinned: a resumed audit must draw the same streams as the session that started it (computed once)
    assert chunk_seed(7, 3) == 5662775645687220410 and chunk_seed(0, 0) == 2003610961884047400


@pytest.mark.parametrize("field,value", [("runs", 0), ("chunk_size", 0), ("limit", 0), ("temperature", -1.0),
                                         ("top_p", 0.0), ("backend", "vllm2"), ("on_reward_error", "ignore"),
                                         ("task_kwargs", "[]"), ("model", "")])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(AuditError, match=field):
        config(**{field: value})


def test_config_needs_a_base_url_for_the_openai_backend():
    with pytest.raises(AuditError, match="base_url"):
        config(backend="openai")
    assert AuditConfig.from_dict(config().to_dict()) == config()


# ---------------------------------------------------------------------------------------------- the runner


def test_run_audit_writes_one_line_per_sample_and_run(engine, tmp_path):
    session = audit(engine, tmp_path)
    assert session["complete"] and session["new_runs"] == 48 and session["chunks"] == 3
    recs = lines_of(tmp_path)
    assert len(recs) == 48
    assert {(r["index"], r["run"]) for r in recs} == {(i, r) for i in range(12) for r in range(4)}
    for r in recs:
        assert set(r) == {"index", "uid", "run", "score", "reason", "completion", "n_tokens", "finish_reason"}
        assert (r["finish_reason"] == "length") == (r["n_tokens"] == 6)
        assert r["score"] in (0.0, 1.0) and r["finish_reason"] in ("stop", "length") and 1 <= r["n_tokens"] <= 6
    info = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert info["format"] == FORMAT and info["config"]["runs"] == 4 and len(info["samples"]) == 12
    assert info["versions"]["torch"] and "device" in info
    assert [r["uid"] for r in recs][::4] == info["samples"]
    sessions = [json.loads(s) for s in (tmp_path / SESSIONS_FILE).read_text().splitlines()]
    assert len(sessions) == 1 and sessions[0]["new_runs"] == 48
    # running it again does nothing
    again = audit(engine, tmp_path)
    assert again["new_runs"] == 0 and again["complete"] and len(lines_of(tmp_path)) == 48


def test_completions_match_a_direct_generate_call(engine, tmp_path):
    """Chunk c is exactly engine.generate(prompts of the chunk, N, params, chunk_seed(seed, c))."""
    cfg = config()
    audit(engine, tmp_path, cfg)
    from rlcurate.tasks import get_task

    task = get_task("arithmetic", **TASK_KW)
    problems = task.problems("test")
    order = audit_order(len(problems), cfg)
    prompts = [task.render(problems[i], engine.tokenizer) for i in order[5:10]]
    direct = engine.generate(prompts, 4, cfg.sampling_params(), seed=chunk_seed(cfg.seed, 1))
    recs = {(r["index"], r["run"]): r for r in lines_of(tmp_path)}
    for k in range(5):
        for j in range(4):
            assert recs[(5 + k, j)]["completion"] == direct[k][j].text


def test_resume_in_steps_equals_one_run(engine, tmp_path):
    full, steps = tmp_path / "full", tmp_path / "steps"
    audit(engine, full)
    s1 = audit(engine, steps, max_chunks=1)
    assert not s1["complete"] and len(lines_of(steps)) == 20
    s2 = audit(engine, steps, max_chunks=1)
    assert s2["runs_before"] == 20 and len(lines_of(steps)) == 40
    audit(engine, steps)
    assert sorted(map(json.dumps, lines_of(full))) == sorted(map(json.dumps, lines_of(steps)))
    assert without_timing(summarize(full)) == without_timing(summarize(steps))
    assert summarize(steps)["timing"]["sessions"] == 3


def test_truncated_last_line_is_cut_and_the_chunk_redone(engine, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    audit(engine, full)
    audit(engine, cut, max_chunks=2)
    raw = (cut / RUNS_FILE).read_bytes()
    # simulate a kill in the middle of the second chunk's write: keep 3 of its lines and half a line
    lines = raw.split(b"\n")
    partial = b"\n".join(lines[:23]) + b"\n" + lines[23][: len(lines[23]) // 2]
    (cut / RUNS_FILE).write_bytes(partial)
    recs, valid = read_runs(cut / RUNS_FILE)
    assert len(recs) == 23 and valid < len(partial)
    assert load_audit(cut).scores  # readable while broken
    session = audit(engine, cut)
    assert session["complete"] and session["resume_mismatches"] == 0
    assert session["new_runs"] == 48 - 23
    assert (cut / RUNS_FILE).read_bytes().count(b"\n") == 48
    assert sorted(map(json.dumps, lines_of(full))) == sorted(map(json.dumps, lines_of(cut)))
    assert without_timing(summarize(full)) == without_timing(summarize(cut))


def test_lost_lines_are_regenerated_identically(engine, tmp_path):
    """A (sample, run) gets the same completion whatever else was already done."""
    audit(engine, tmp_path)
    recs = lines_of(tmp_path)
    keep = [r for r in recs if not (r["index"] in (2, 7, 11) and r["run"] in (0, 3))]
    (tmp_path / RUNS_FILE).write_text("".join(json.dumps(r) + "\n" for r in keep))
    session = audit(engine, tmp_path)
    assert session["new_runs"] == 6 and session["resume_mismatches"] == 0
    assert sorted(map(json.dumps, lines_of(tmp_path))) == sorted(map(json.dumps, recs))


def test_a_larger_limit_extends_the_audit(engine, tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    audit(engine, small, config(limit=10))
    before = lines_of(small)
    audit(engine, small, config(limit=12))
    audit(engine, big, config(limit=12))
    after = lines_of(small)
    assert after[: len(before)] == before and len(after) == 48
    assert sorted(map(json.dumps, after)) == sorted(map(json.dumps, lines_of(big)))
    assert load_audit(small).n_samples == 12


def test_a_different_config_is_refused_naming_the_fields(engine, tmp_path):
    audit(engine, tmp_path)
    with pytest.raises(AuditError, match=r"runs: 4 \(recorded\) != 8"):
        audit(engine, tmp_path, config(runs=8))
    with pytest.raises(AuditError, match="seed"):
        audit(engine, tmp_path, config(seed=4))


def test_runs_without_config_are_refused(engine, tmp_path):
    (tmp_path / RUNS_FILE).write_text('{"index": 0}\n')
    with pytest.raises(AuditError, match="config.json"):
        audit(engine, tmp_path)


def test_a_raising_reward_function_scores_zero_and_keeps_the_reason(engine, tmp_path):
    def flaky(problem, text):
        if problem.uid.startswith("mul"):
            raise KeyError("verifier exploded")
        return parity_reward(problem, text)

    session = run_audit(config(), tmp_path, engine=engine, tokenizer=engine.tokenizer, reward_fn=flaky)
    recs = lines_of(tmp_path)
    bad = [r for r in recs if r["uid"].startswith("mul")]
    assert bad and session["complete"] and session["reward_errors"] == len(bad)
    assert all(r["score"] == 0.0 and r["reason"].startswith("reward error: KeyError") and r["reward_error"]
               for r in bad)
    assert not any("reward_error" in r for r in recs if not r["uid"].startswith("mul"))
    s = summarize(tmp_path)
    assert s["reward_errors"]["runs"] == len(bad) and s["reward_errors"]["share"] == pytest.approx(len(bad) / 48)
    assert s["verdict"]["code"] == "reward_errors" and s["advice"] is None


def test_non_numeric_rewards_score_zero(engine, tmp_path):
    run_audit(config(limit=5), tmp_path, engine=engine, tokenizer=engine.tokenizer,
              reward_fn=lambda p, t: float("nan") if len(t) % 2 else "yes")
    assert all(r["score"] == 0.0 and r["reason"].startswith("reward error") for r in lines_of(tmp_path))


def test_stop_on_reward_error_keeps_finished_chunks_and_resumes(engine, tmp_path):
    calls = {"n": 0}

    def breaks_in_chunk_two(problem, text):
        calls["n"] += 1
        if calls["n"] > 25:
            raise RuntimeError("network verifier down")
        return parity_reward(problem, text)

    cfg, out, full = config(on_reward_error="stop"), tmp_path / "stopped", tmp_path / "full"
    with pytest.raises(AuditStopped, match="network verifier down"):
        run_audit(cfg, out, engine=engine, tokenizer=engine.tokenizer, reward_fn=breaks_in_chunk_two)
    assert len(lines_of(out)) == 20  # the first chunk only; nothing half-written
    session = audit(engine, out, cfg)
    assert session["complete"] and len(lines_of(out)) == 48
    audit(engine, full)
    assert without_timing(summarize(full)) == without_timing(summarize(out))


@pytest.mark.parametrize("kw,match", [
    (dict(task="no_such_task"), "not a known task"),
    # the error repeats the task arguments first: match the message proper, not the echo
    (dict(task_kwargs={"levels": ["add99"]}), "level must look like 'add3' or 'mul2x1', got 'add99'"),
    (dict(task_kwargs={"colour": "red"}), "task 'arithmetic' does not take colour; it takes "),
    (dict(split="dev"), "split must be 'train', 'test' or 'validation', got 'dev'"),
])
def test_bad_task_input_is_named(engine, tmp_path, kw, match):
    with pytest.raises(AuditError, match=match):
        audit(engine, tmp_path, config(**kw))
    assert not (tmp_path / RUNS_FILE).exists()


def test_malformed_dataset_rows_are_named(engine, tmp_path):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    good = {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}
    (data / "test.jsonl").write_text(json.dumps(good) + "\n" + '{"question": "broken", "answer": 5}\n')
    cfg = config(task="gsm8k", task_kwargs={"data_dir": str(tmp_path / "data")}, limit=None)
    with pytest.raises(AuditError, match=r"test.jsonl, line 2: field 'answer'"):
        audit(engine, tmp_path / "out", cfg)


def test_unknown_model_is_named(tmp_path):
    with pytest.raises(AuditError, match="no/such-checkpoint"):
        run_audit(config(model=str(tmp_path / "no/such-checkpoint")), tmp_path / "out")


def test_malformed_complete_line_is_an_error_with_its_line_number(tmp_path):
    (tmp_path / RUNS_FILE).write_text('{"index": 0, "uid": "a", "run": 0, "score": 1.0, "reason": "", '
                                      '"completion": "", "n_tokens": 1, "finish_reason": "stop"}\nnot json\n')
    with pytest.raises(AuditError, match="line 2"):
        read_runs(tmp_path / RUNS_FILE)
    (tmp_path / RUNS_FILE).write_text('{"index": 0, "uid": "a", "run": 0, "score": "1"}\n')
    with pytest.raises(AuditError, match="field 'score'"):
        read_runs(tmp_path / RUNS_FILE)


# ---------------------------------------------------------------------------------------------- the summary


def write_fake_audit(out: Path, scores: list[list[float]], runs: int | None = None, **cfg) -> None:
    """An audit folder with the given score matrix (rows may be shorter than ``runs``)."""
    out.mkdir(parents=True, exist_ok=True)
    runs = runs or max(len(r) for r in scores)
    c = config(runs=runs, limit=len(scores), **cfg).to_dict()
    uids = [f"s{i}" for i in range(len(scores))]
    (out / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, "config": c, "samples": uids,
                                               "n_samples": len(scores)}))
    lines = [json.dumps({"index": i, "uid": uids[i], "run": j, "score": float(s), "reason": "", "completion": "x",
                         "n_tokens": 3, "finish_reason": "stop"})
             for i, row in enumerate(scores) for j, s in enumerate(row)]
    (out / RUNS_FILE).write_text("\n".join(lines[::-1]) + "\n")  # order on disk does not matter


def test_summary_of_a_known_matrix(tmp_path):
    scores = [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 1, 0], [0, 0, 0]]
    write_fake_audit(tmp_path, scores)
    s = write_summary(tmp_path, plots=True)
    M = np.array(scores, dtype=float)
    assert s["categories"] == {"always_right": 2, "always_wrong": 3, "mixed": 3}
    assert s["mean"] == pytest.approx(M.mean()) and s["best_of_n"] == pytest.approx(M.max(1).mean())
    assert s["gain"] == pytest.approx(M.max(1).mean() - M.mean())
    assert s["pass_count_hist"] == {"0": 3, "1": 2, "2": 1, "3": 2}
    assert s["pass_at_k"]["k"] == [1, 2, 3]
    assert s["pass_at_k"]["pass_at_k"] == pytest.approx(pass_at_k_curve(scores, [1, 2, 3])["pass_at_k"].tolist())
    assert s["pass_at_k"]["pass_at_k"][-1] == pytest.approx(5 / 8)  # pass@N = best-of-N for binary scores
    assert s["mixed_share"]["share"] == 3 / 8 and s["mixed_share"]["low"] < 3 / 8 < s["mixed_share"]["high"]
    assert s["verdict"]["code"] == "mixed" and s["verdict"]["text"].startswith("37.5% of the prompts are mixed in 3 runs")
    assert s["reward_errors"]["runs"] == 0 and s["truncation"] == {"runs": 0, "share": 0.0, "failed_runs": 0,
                                                                   "failed_share": 0.0, "max_new_tokens": 6}
    g = s["gate"]["by_group_size"]
    assert g["3"] == {"share": 3 / 8, "source": "measured"}  # at G = N the measured share is the mixed share
    assert g["2"]["share"] == pytest.approx(np.mean([0, 0, 0, 2 / 3, 2 / 3, 0, 2 / 3, 0]))
    assert g["6"]["source"] == "fit" and s["advice"]["share_doubled"] == g["6"]["share"]
    fit = fit_beta_mixture(M.sum(1).astype(int), np.full(8, 3))  # the fit and the number rlcurate advise reports
    assert g["6"]["share"] == pytest.approx(1 - fit.zero_variance(6), rel=1e-9)
    a, b = fit_beta_prior(M.sum(1).astype(int), np.full(8, 3))
    assert s["reliability"]["prior"]["a"] == pytest.approx(a, rel=1e-9)
    assert s["reliability"]["uniform_share_of_truly_mixed"] == pytest.approx(beta_uniform_prob(3, a, b), rel=1e-9)
    assert s["reliability"]["runs_needed"]["0.5"] == 6   # 2 * 0.5^n <= 0.05 from n = 6
    mixed = [json.loads(x) for x in (tmp_path / "mixed.jsonl").read_text().splitlines()]
    assert [(m["uid"], m["n_runs"], m["split"], m["task"]) for m in mixed] == [
        ("s3", 3, "test", "arithmetic"), ("s4", 3, "test", "arithmetic"), ("s6", 3, "test", "arithmetic")]
    assert [m["mean"] for m in mixed] == pytest.approx([1 / 3, 2 / 3, 1 / 3])
    per = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [p["category"] for p in per][:5] == ["always_right", "always_wrong", "always_wrong", "mixed", "mixed"]
    assert per[4]["variance"] == pytest.approx(np.var([1, 1, 0])) and per[4]["std"] == pytest.approx(np.std([1, 1, 0]))
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    assert (tmp_path / "variance.png").stat().st_size > 1000 and (tmp_path / "pass_rates.png").stat().st_size > 1000


def test_graded_scores_and_threshold(tmp_path):
    scores = [[0.5, 0.5], [1.0, 0.2], [0.8, 0.8]]
    write_fake_audit(tmp_path, scores, success_threshold=0.8)
    s = summarize(tmp_path)
    assert not s["binary_scores"]
    assert s["categories"] == {"always_right": 1, "always_wrong": 1, "mixed": 1}
    assert s["pass_count_hist"] == {"0": 1, "1": 1, "2": 1}


def test_incomplete_audit_is_summarised_and_flagged(tmp_path):
    write_fake_audit(tmp_path, [[1, 0, 1, 1], [0, 0]], runs=4)
    s = summarize(tmp_path)
    assert not s["complete"] and s["n_runs"] == 6 and s["pass_count_hist"] is None
    assert s["pass_at_k"]["k"] == [1, 2]


def test_uniform_audit_has_no_prior(tmp_path):
    write_fake_audit(tmp_path, [[0, 0, 0]] * 5)
    s = summarize(tmp_path)
    assert s["reliability"]["prior"] is None and s["verdict"]["code"] == "uncertain"
    assert s["verdict"]["text"].startswith("cannot tell whether fewer than 10% of the prompts are mixed in 3 runs")
    assert s["relative_gain"] == 0.0


def test_summary_of_an_empty_audit_is_an_error(tmp_path):
    write_fake_audit(tmp_path, [[1]])
    (tmp_path / RUNS_FILE).write_text("")
    with pytest.raises(AuditError, match="no finished runs"):
        summarize(tmp_path)
    with pytest.raises(AuditError, match="not an audit folder"):
        summarize(tmp_path / "nothing")


def test_beta_uniform_prob_matches_monte_carlo():
    rng = np.random.default_rng(0)
    for a, b, n in [(0.5, 0.5, 3), (2.0, 0.7, 4), (0.3, 1.5, 8)]:
        p = rng.beta(a, b, 400_000)
        mc = np.mean(p**n + (1 - p) ** n)
        se = np.std(p**n + (1 - p) ** n) / np.sqrt(p.size)
        assert abs(beta_uniform_prob(n, a, b) - mc) < 5 * se
    assert beta_uniform_prob(1, 0.7, 2.0) == pytest.approx(1.0)


def test_plots_draw_one_point_per_sample():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = [[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]]
    fig = plot_variance(scores, title="t")
    ax = fig.axes[0]
    best = ax.collections[-1].get_offsets()
    assert len(best) == 4 and list(best[:, 1]) == [0, 1, 1, 1]  # sorted by mean: 0, 1/3, 2/3, 1
    plt.close(fig)
    fig = plot_pass_rate_hist(scores)
    assert [p.get_height() for p in fig.axes[0].patches] == [1, 1, 1, 1]
    plt.close(fig)
    fig = plot_zero_variance((2, 3))
    assert len(fig.axes[0].lines) == 2
    plt.close(fig)


def test_a_second_audit_in_the_same_folder_is_refused_while_one_runs(engine, tmp_path):
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(AuditError, match="another audit is running"):
            audit(engine, tmp_path)
    assert audit(engine, tmp_path)["complete"]  # free again once the holder is gone


def test_an_engine_that_rejects_its_input_is_a_named_error(tmp_path):
    class Rejecting:
        def generate(self, prompts, n, params, seed=0):
            raise ValueError("prompts[0] holds token id 999, outside the model's vocabulary")

    with pytest.raises(AuditError, match="rejected chunk 0.*token id 999"):
        run_audit(config(), tmp_path, engine=Rejecting(), tokenizer=build_tiny_tokenizer(), reward_fn=parity_reward)
    assert read_runs(tmp_path / RUNS_FILE)[0] == []
