"""``rlcurate advise`` (issue #29): the Beta-mixture fit of a pool's pass rates, the gate measured and
extrapolated, the simulation's ceiling, and one clear line for each bad input (tests/BAD_INPUTS.md, A10-A17)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, special

from rlcurate.advise import _verdict, advise, advise_counts, load_pool, never_solved_share, read_counts, render, sim_prompts
from rlcurate.cli import main
from rlcurate.stats import group_mixed_prob
from rlcurate.stats import mixture
from rlcurate.stats.mixture import fit_beta_mixture

REPO = Path(__file__).resolve().parents[1]


def piles_and_spread(rng, n_prompts=2000, runs=8):
    """An LLM-like pool: 30 % never solved, 20 % always solved, the rest spread (chapter 1)."""
    p = np.r_[np.zeros(int(0.3 * n_prompts)), np.ones(int(0.2 * n_prompts)), rng.beta(2, 2, n_prompts // 2)]
    return p, rng.binomial(runs, p), np.full(p.size, runs)


def test_the_mixture_recovers_the_gate_of_a_pool_with_piles_at_0_and_1():
    rng = np.random.default_rng(0)
    p, k, n = piles_and_spread(rng)
    fit = fit_beta_mixture(k, n)
    one = fit_beta_mixture(k, n, components=1)
    assert fit.k >= 2 and fit.loglik > one.loglik + 10  # one Beta cannot hold both piles and the spread
    for G in (2, 8, 32):  # 32 is beyond the 8 runs: extrapolated by the fitted shape
        truth = np.mean(p**G + (1 - p) ** G)
        assert abs(fit.zero_variance(G) - truth) < 0.03, G
    assert abs(fit.mean - p.mean()) < 0.02


def test_the_likelihood_gradient_is_the_derivative_of_the_likelihood():
    rng = np.random.default_rng(1)
    _, k, n = piles_and_spread(rng, 300)
    kk, nn, c = mixture.count_table(k, n)
    log_binom = special.gammaln(nn + 1) - special.gammaln(kk + 1) - special.gammaln(nn - kk + 1)
    theta = rng.normal(size=8)
    f = lambda t: mixture._neg_loglik(t, 3, kk, nn, c, log_binom)[0]  # noqa: E731
    numeric = optimize.approx_fprime(theta, f, 1e-6)
    assert np.allclose(mixture._neg_loglik(theta, 3, kk, nn, c, log_binom)[1], numeric, rtol=1e-4, atol=1e-3)


def test_the_measured_gate_is_the_unbiased_estimate_of_chapter_4():
    rng = np.random.default_rng(2)
    _, k, n = piles_and_spread(rng, 200)
    scores = [np.r_[np.ones(ki), np.zeros(ni - ki)] for ki, ni in zip(k, n)]
    for G in (2, 4, 8):
        assert mixture.measured_zero_variance(k, n, G) == pytest.approx(1 - np.mean(group_mixed_prob(scores, G)))


def write_audit(folder: Path, scores: list[list[float]], prefix: str = "p") -> Path:
    """A minimal audit folder in the format `rlcurate audit` writes (config.json, runs.jsonl)."""
    folder.mkdir(parents=True, exist_ok=True)
    uids = [f"{prefix}{i}" for i in range(len(scores))]
    runs = max(len(s) for s in scores)
    (folder / "config.json").write_text(json.dumps({
        "format": "rlcurate-audit/1", "config": {"model": "m", "task": "t", "runs": runs, "success_threshold": 1.0},
        "samples": uids, "n_samples": len(uids)}))
    with open(folder / "runs.jsonl", "w") as f:
        for i, s in enumerate(scores):
            for r, v in enumerate(s):
                f.write(json.dumps({"index": i, "uid": uids[i], "run": r, "score": v, "n_tokens": 3,
                                    "finish_reason": "stop"}) + "\n")
    return folder


def test_advise_reads_an_audit_and_reports_the_gate_measured_then_fitted(tmp_path, capsys):
    rng = np.random.default_rng(3)
    _, k, n = piles_and_spread(rng, 120)
    audit = write_audit(tmp_path / "audit", [[1.0] * ki + [0.0] * (8 - ki) for ki in k])
    assert main(["advise", str(audit), "--no-sim", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 120 and out["runs"] == 8 and out["simulation"] is None
    gate = {row["G"]: row for row in out["gate"]}
    assert [gate[G]["measured"] for G in (2, 4, 8, 16, 32, 64)] == [True, True, True, False, False, False]
    assert gate[8]["zero_variance"] == pytest.approx(mixture.measured_zero_variance(k, n, 8))  # the audit's own share
    assert all(r["low"] <= r["zero_variance"] <= r["high"] for r in out["gate"])
    assert [gate[G]["zero_variance"] for G in (2, 4, 8, 16, 32, 64)] == sorted(
        [gate[G]["zero_variance"] for G in (2, 4, 8, 16, 32, 64)], reverse=True)  # larger groups mix more
    assert (audit / "advice_gate.json").is_file() and (audit / "advice_gate.png").stat().st_size > 1000
    assert not (audit / "advice.json").exists()  # a full run's advice is not overwritten by the gate alone
    assert "groups would carry no signal" in out["verdict"]


PILES = dict(group_size=8, seeds=2, boots=20, pool=1000)


@pytest.fixture(scope="module")
def piles():
    """The conditions map's main pool, Beta(0.5, 0.5), audited 8 times a prompt, and advise's exact-oracle answer."""
    rng = np.random.default_rng(4)
    k = rng.binomial(8, rng.beta(0.5, 0.5, 420))
    return k, advise_counts(k, np.full(k.size, 8), **PILES)


def test_the_simulated_ceiling_is_below_uniform_on_a_pool_with_piles(piles):
    # choosing the mixed prompts pays (chapter 11: 0.45)
    a = piles[1]
    assert any("a pool of 1,000 prompts is simulated by 420 training prompts, each revisited about 2.4 times" in w
               for w in a.warnings)
    ro = a.sim["ratios"]["rollouts"]
    assert set(ro) == {"oracle_select", "oracle_alloc", "dapo", "greso", "uniform_g2", "uniform_g4", "uniform_g16", "uniform_g32"}
    assert ro["oracle_select"]["ratio"] < 0.8
    assert a.sim["world_prompts"] == sim_prompts(420) == 600 and sim_prompts(60) == 86
    # the verdict keeps its own rule: a saving only where the interval and the Holm-adjusted p both exclude noise
    sel = ro["oracle_select"]
    if sel["high"] < 1 and sel["p_holm"] < 0.05:
        assert "with exact pass rates an oracle saves about" in a.verdict
    else:
        assert "with exact pass rates the saving is within the noise of 2 seeds" in a.verdict
    text = render(a)
    assert "PREDICTED in a simulated world" in text and "\ncaveat: predictions of a simulated world" in text
    assert a.to_dict()["caveat"].startswith("predictions of a simulated world")


def test_a_dense_trainer_is_told_what_training_groups_without_signal_costs_it(piles):
    """--training dense (the default): the share of a step's cost that trains zero-advantage groups at the start,
    rho z / (1 + rho) with z the audit's zero-variance share at G, and, from the same simulated runs, uniform GRPO
    that skips them set against the samplers that save dense cost by training only mixed groups (chapters 10, 11)."""
    k, a = piles
    n = np.full(k.size, 8)
    z = mixture.measured_zero_variance(k, n, 8)
    assert a.dense_waste["share"] == pytest.approx(1.0 * z / 2) and a.dense_waste["measured"]
    assert a.dense_waste["low"] <= a.dense_waste["share"] <= a.dense_waste["high"]
    ratios = a.sim["ratios"]
    skip = ratios["skip_zero"]["uniform_skip_zero"]
    assert skip["ratio"] < 1  # the same runs, minus the training of groups without signal
    assert set(ratios["cost_vs_skipping"]) == {"dapo", "greso"}
    for arm in ("dapo", "greso"):  # paired geometric means over the same seeds: the ratios chain
        assert ratios["cost_vs_skipping"][arm]["ratio"] == pytest.approx(ratios["cost"][arm]["ratio"] / skip["ratio"])
    text = render(a)
    assert f"so rho z / (1 + rho) = {a.dense_waste['share']:.0%}" in text
    assert "PREDICTED: uniform GRPO that skips them reaches the target with" in text
    assert "in verl 0.9: +data.sampler.skip_zero_advantage=true" in text  # the options that do it (appendix A2)
    assert "in TRL 1.16: the mixin rlcurate.interop.trl_skip.ZeroAdvantageSkipping" in text
    assert "skip them before changing the sampler (predicted: " in a.verdict
    assert a.to_dict()["dense_waste"]["share"] == a.dense_waste["share"]
    # measured without the simulation; nothing to say where the trainer already skips them or training is free
    gate_only = advise_counts(k, n, rho=2.79, sim=False)
    assert gate_only.dense_waste["share"] == pytest.approx(2.79 * z / 3.79)
    assert gate_only.verdict.endswith("skip them before changing the sampler")
    for quiet in (advise_counts(k, n, training="sparse", sim=False), advise_counts(k, n, rho=0.0, sim=False)):
        assert quiet.dense_waste is None and "kept group" not in quiet.verdict and "dense training" not in render(quiet)


def test_oracles_fed_by_a_periodic_audit_pay_for_stale_pass_rates(piles):
    """--oracle-every: the oracles read pass rates sampled by an uncharged audit every so many rollouts (as on a
    language model, chapter 11) instead of exact ones every step; on the pool with piles the stale selection
    needs more rollouts than the exact one, and the verdict says which it read."""
    k, exact = piles
    stale = advise_counts(k, np.full(k.size, 8), oracle_every=1300, **PILES)  # rounded to 10 steps of 128
    assert exact.sim["oracle"] == {} and stale.sim["oracle"] == {"refresh": 10, "runs": 8, "exact": False}
    ro_exact, ro_stale = exact.sim["ratios"]["rollouts"], stale.sim["ratios"]["rollouts"]
    assert ro_stale["oracle_select"]["ratio"] > ro_exact["oracle_select"]["ratio"] + 0.15
    assert ro_stale["dapo"] == ro_exact["dapo"]  # the other arms are not touched
    assert stale.verdict.startswith("with pass rates audited every 1,280 rollouts (8 runs a prompt, uncharged) ")
    assert exact.verdict.startswith("with exact pass rates ")
    assert "the oracles read pass rates audited every 1,280 rollouts" in render(stale)


def test_a_floor_out_of_reach_is_simulated_and_said(piles):
    """--out-of-reach: the hardest share of the simulated pool never moves; the run records and prints it, and
    the other arms change (the world is another one)."""
    k, exact = piles
    floor = advise_counts(k, np.full(k.size, 8), out_of_reach=0.1, **PILES)
    assert floor.sim["out_of_reach"] == 0.1 and exact.sim["out_of_reach"] == 0.0
    assert floor.sim["ratios"]["rollouts"]["uniform_g2"] != exact.sim["ratios"]["rollouts"]["uniform_g2"]
    assert "; 10% of the pool out of reach" in render(floor) and "out of reach" not in render(exact)
    # a fifth out of reach caps this pool (half its prompts start above 0.5) below the default target
    capped = advise_counts(k, np.full(k.size, 8), out_of_reach=0.2, **PILES)
    assert capped.sim["unreached"] and "with 20% of it out of reach (its pass rate cannot rise above about 0.80)" in capped.verdict


def test_the_floor_is_read_from_an_audit_of_a_later_checkpoint(tmp_path, monkeypatch, capsys):
    """--out-of-reach-from: the share of the first audit's prompts that a later audit never solves is the floor
    the simulation keeps out of reach; the output says where it came from, and the warning about never-solved
    prompts (the world's optimism) is not repeated once a floor is simulated."""
    import rlcurate.advise as advise_module

    start = write_audit(tmp_path / "start", [[0.0] * 8] * 15 + [[1.0, 0.0] * 4] * 25)
    later = write_audit(tmp_path / "later", [[0.0] * 8] * 6 + [[1.0] * 8] * 30)  # p0-p5 still never solved
    share, note, warns = advise_module.never_solved_share(start, later)
    assert share == pytest.approx(6 / 36) and note == f"6 of 36 prompts never solved in 8 runs of a later checkpoint, {later}"
    assert warns == []
    # the two audits swapped, and a later audit of a part of the pool, are said
    assert "is it the later checkpoint's audit" in " ".join(advise_module.never_solved_share(later, start)[2])
    part = write_audit(tmp_path / "part", [[0.0] * 8] * 5 + [[1.0] * 8] * 20)
    assert "audits 25 of the 40 prompts" in " ".join(advise_module.never_solved_share(start, part)[2])
    seen = {}

    def fake_simulate(*args, out_of_reach, **kw):  # the plumbing, without the simulation's seconds
        seen["out_of_reach"] = out_of_reach
        return {"unreached": True, "close_gap": 0.5, "budget_cap": 51200, "out_of_reach": out_of_reach, "lr": {}, "seeds": 2}

    monkeypatch.setattr(advise_module, "simulate", fake_simulate)
    a = advise(start, out_of_reach_from=later, boots=20)
    assert seen["out_of_reach"] == pytest.approx(6 / 36) and a.sim["out_of_reach_from"] == note
    assert "with 17% of it out of reach" in a.verdict
    assert not any("never solved in their runs" in w for w in a.warnings)
    assert any("never solved in their runs" in w and "--out-of-reach-from LATER_AUDIT" in w
               for w in advise(start, boots=20).warnings)
    # with --no-sim the simulation's options are said to be ignored
    quiet = advise(start, sim=False, boots=20, seeds=16, out_of_reach_from=later)
    assert "ignored with --no-sim (they shape the simulation only): --seeds, --out-of-reach-from" in quiet.warnings
    # ... also where given at their default values; rho and training set the dense waste, so they are read
    quiet = advise(start, sim=False, boots=20, seeds=4, close_gap=advise_module.SIM_CLOSE_GAP, out_of_reach=0.0)
    assert "ignored with --no-sim (they shape the simulation only): --seeds, --close-gap, --out-of-reach" in quiet.warnings
    dense = advise(start, sim=False, boots=20, rho=5.0)
    assert not any("ignored" in w for w in dense.warnings) and dense.dense_waste["rho"] == 5.0
    assert advise(start, sim=False, boots=20, training="sparse").dense_waste is None
    # bad later audits, one line each
    (tmp_path / "a-file.json").write_text("{}")
    other = write_audit(tmp_path / "other", [[1.0, 0.0] * 4] * 30, prefix="q")
    none = write_audit(tmp_path / "none", [[0.0] * 8] * 40)
    for argv, needle in ((["--out-of-reach-from", str(tmp_path / "nowhere")], "--out-of-reach-from: "),
                         (["--out-of-reach-from", str(tmp_path / "a-file.json")], "a file, not an audit folder"),
                         (["--out-of-reach-from", str(other)], "shares 0 prompts with"),
                         (["--out-of-reach-from", str(none)], "solved none of the 40 shared prompts"),
                         (["--out-of-reach-from", str(later), "--out-of-reach", "0.1"], "not both")):
        _one_line_error(capsys, ["advise", str(start), *argv], needle)


def test_the_simulation_says_where_its_table_is_weaker_than_it_looks():
    from rlcurate.advise import _simulation_warnings

    sim = {"seeds": 4, "uniform_reached": 1}
    assert _simulation_warnings(sim, None)[0].startswith("uniform GRPO reached the target in 1 of 4 seeds within 51,200")
    assert _simulation_warnings({**sim, "uniform_reached": 4}, None) == []
    assert "is rollouts, not steps" in _simulation_warnings({**sim, "uniform_reached": 4}, 10)[0]
    assert "past the simulation's 51,200 rollouts" in _simulation_warnings({**sim, "uniform_reached": 4}, 100_000)[0]
    assert _simulation_warnings({**sim, "uniform_reached": 4}, 1280) == []


def test_the_ceiling_within_the_noise_is_said_so_whatever_its_interval():
    """The helper's case: oracle selection 0.30 [0.15, 0.58] with Holm p 0.083 is not a saving the verdict may
    claim (its own rule: both the interval and the adjusted p exclude noise)."""
    r = {"ratio": 0.30, "low": 0.15, "high": 0.58, "p_holm": 0.083}
    sim = {"seeds": 4, "ratios": {cur: {"oracle_select": r, "oracle_alloc": {**r, "ratio": 0.9, "low": 0.6, "high": 1.3,
                                                                             "p_holm": 1.0},
                                        "dapo": {**r, "ratio": 1.0, "low": 0.8, "high": 1.2, "p_holm": 1.0},
                                        "greso": {**r, "ratio": 1.0, "low": 0.8, "high": 1.2, "p_holm": 1.0}}
                                  for cur in ("rollouts", "cost")}}
    verdict = _verdict(sim, [], 8)
    assert verdict.startswith("with exact pass rates the saving is within the noise of 4 seeds here (oracle select: "
                              "0.30 [0.15, 0.58] of uniform's, Holm p 0.083")
    sim["ratios"]["rollouts"]["oracle_select"] = {**r, "p_holm": 0.01}
    assert _verdict(sim, [], 8).startswith("with exact pass rates an oracle saves about 70% of the rollouts to the target in the "
                                            "simulated world of this pool")
    # a faster group size is a hypothesis to test, not an instruction: the measured runs of chapter 11 found none
    sim["ratios"]["rollouts"]["uniform_g2"] = {"ratio": 0.49, "low": 0.42, "high": 0.58, "p_holm": 0.005}
    assert _verdict(sim, [], 8).endswith("G = 2 is faster in the simulation (0.49 [0.42, 0.58] of G = 8's rollouts, "
                                         "Holm p 0.005): a hypothesis for a paired run, not a measurement")


def test_an_audit_with_many_never_solved_prompts_or_a_limit_is_warned(tmp_path):
    rng = np.random.default_rng(6)
    k = np.r_[np.zeros(30, int), rng.binomial(8, 0.5, 50)]
    folder = write_audit(tmp_path / "a", [[1.0] * ki + [0.0] * (8 - ki) for ki in k])
    cfg = json.loads((folder / "config.json").read_text())
    cfg["config"]["limit"] = 80
    (folder / "config.json").write_text(json.dumps(cfg))
    a = advise(folder, sim=False, boots=20)
    assert any(w.startswith("30 of 80 prompts (38%) were never solved in their runs") for w in a.warnings)
    assert any(w.startswith("the audit covers 80 prompts of its split (--limit)") for w in a.warnings)
    assert not any("--limit" in w for w in advise(folder, sim=False, boots=20, pool=5000).warnings)
    big = advise_counts(k, np.full(k.size, 8), pool=5000, seeds=2, boots=20, sim=False)
    assert not any("simulated by" in w for w in big.warnings)  # no simulation, nothing simulated


def test_a_slimmed_audit_without_reasons_is_read():
    k, n, warnings = read_counts(REPO / "data" / "audits" / "smollm2_gsm8k")
    assert k.size == 32 and (n == 8).all() and any("token limit" in w for w in warnings)


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("case", ["no-folder", "not-an-audit", "graded", "one-run", "few-prompts", "all-right",
                                  "all-wrong", "runs-is-a-folder", "config-without-runs", "nan-score", "unreadable"])
def test_bad_audits_are_refused_in_one_line(tmp_path, capsys, monkeypatch, case):
    rng = np.random.default_rng(5)
    if case in ("all-right", "all-wrong"):  # no signal at any group size: said at once, not after a simulation
        folder = write_audit(tmp_path / case, [[float(case == "all-right")] * 8] * 30)
        needle = f"every one of the 30 audited prompts was {'solved' if case == 'all-right' else 'failed'} in all its runs"
        _one_line_error(capsys, ["advise", str(folder)], needle, "GRPO learns nothing from this pool")
        return
    if case == "runs-is-a-folder":
        folder, needle = tmp_path / "r", "not an audit folder (runs.jsonl is not a file"
        write_audit(folder, [[1.0, 0.0]] * 30)
        (folder / "runs.jsonl").unlink()
        (folder / "runs.jsonl").mkdir()
    elif case == "config-without-runs":
        folder, needle = write_audit(tmp_path / "c", [[1.0, 0.0]] * 30), "config.runs must be a whole number >= 1"
        cfg = json.loads((folder / "config.json").read_text())
        del cfg["config"]["runs"]
        (folder / "config.json").write_text(json.dumps(cfg))
    elif case == "nan-score":
        folder, needle = write_audit(tmp_path / "n", [[1.0, float("nan")]] + [[1.0, 0.0]] * 29), "line 2: field 'score'"
    elif case == "unreadable":  # as a user without read permission sees it (the tests may run as root)
        folder = write_audit(tmp_path / "u", [[1.0, 0.0]] * 30)
        needle = f"{folder / 'runs.jsonl'}: permission denied"
        real = Path.read_bytes
        monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(
            PermissionError(13, "Permission denied", str(self))) if self.name == "runs.jsonl" else real(self))
    elif case == "no-folder":
        folder, needle = tmp_path / "missing", "no such folder"
    elif case == "not-an-audit":
        folder, needle = tmp_path / "plain", "not an audit folder"
        folder.mkdir()
    elif case == "graded":
        folder, needle = write_audit(tmp_path / "g", [[0.5, 1.0, 0.0, 1.0]] * 30), "graded rewards"
    elif case == "one-run":
        folder, needle = write_audit(tmp_path / "o", [[float(v)] for v in rng.integers(0, 2, 50)]), "1 run per prompt"
    else:
        folder, needle = write_audit(tmp_path / "f", [[1.0, 0.0, 1.0, 1.0]] * 5), "at least 20"
    _one_line_error(capsys, ["advise", str(folder), "--no-sim"], needle)


@pytest.mark.parametrize("option,needle", [(["--group-size", "6"], "--group-size"), (["--rho", "-1"], "--rho"),
                                           (["--seeds", "1"], "--seeds"), (["--close-gap", "1.5"], "--close-gap"),
                                           (["--training", "full"], "--training"), (["--budget", "0"], "--budget"),
                                           (["--oracle-every", "0"], "--oracle-every"),
                                           (["--oracle-every", "1280", "--oracle-runs", "0"], "--oracle-runs"),
                                           (["--oracle-runs", "4"], "only with --oracle-every"),
                                           (["--out-of-reach", "1"], "--out-of-reach"),
                                           (["--out", ""], "--out: empty")])
def test_bad_options_are_refused_before_the_audit_is_read(tmp_path, capsys, option, needle):
    _one_line_error(capsys, ["advise", str(tmp_path / "not-read"), *option], needle)


def test_what_advise_cannot_write_or_read_is_said_before_it_simulates(tmp_path, capsys, monkeypatch):
    """The advice goes into the audit folder by default: one that cannot be written is refused before the
    simulation (as --out is); an --out-of-reach-from that is the audit itself is refused; a pool smaller than
    the audit, or than the smallest simulated world, is warned; a rerun says it replaced the earlier advice."""
    import os

    from rlcurate import advise as advise_module

    rng = np.random.default_rng(7)
    folder = write_audit(tmp_path / "a", [[1.0] * k + [0.0] * (8 - k) for k in rng.binomial(8, 0.5, 40)])
    monkeypatch.setattr(advise_module, "simulate", lambda *a, **k: pytest.fail("simulated before refusing"))
    real_access = os.access
    monkeypatch.setattr(advise_module.os, "access", lambda path, mode: Path(path) != folder)  # as a user, not root
    _one_line_error(capsys, ["advise", str(folder)], f"{folder}: the advice is written into the audit folder, which "
                    "this user cannot write; give --out FOLDER")
    monkeypatch.setattr(advise_module.os, "access", real_access)
    with pytest.raises(SystemExit) as exc:  # a prefix of an option is refused, not completed: --seed 3 is not --seeds 3
        main(["advise", str(folder), "--seed", "3"])
    assert exc.value.code == 2 and "unrecognized arguments: --seed 3" in capsys.readouterr().err
    _one_line_error(capsys, ["advise", str(folder), "--out-of-reach-from", str(folder)], "is the audit being advised on")
    a = advise(folder, sim=False, boots=20, pool=5)
    assert any(w.startswith("--pool-size 5 is smaller than the 40 prompts audited") for w in a.warnings)
    assert main(["advise", str(folder), "--no-sim", "--boots", "20"]) == 0
    assert "replacing" not in capsys.readouterr().out
    assert main(["advise", str(folder), "--no-sim", "--boots", "20"]) == 0
    assert "advice_gate.png (replacing the earlier ones)" in capsys.readouterr().out


def test_a_pool_smaller_than_the_smallest_simulated_world_is_warned(monkeypatch):
    from rlcurate import advise as advise_module

    monkeypatch.setattr(advise_module, "simulate", lambda *a, **k: None)  # the warning, without the simulation
    k = np.random.default_rng(8).binomial(8, 0.5, 40)
    small = advise_counts(k, np.full(k.size, 8), pool=5, seeds=2, boots=20)
    assert any(w.startswith("a pool of 5 prompts is simulated by 28 training prompts") for w in small.warnings)
    assert not any("simulated by" in w for w in advise_counts(k, np.full(k.size, 8), pool=28, seeds=2,
                                                              boots=20).warnings)


def test_the_audit_summary_reports_advises_gate(tmp_path, capsys):
    """One gate: the audit summary's shares (measured, then the Beta-mixture fit) are 1 minus advise's
    zero-variance shares, read from the same prompts, also when an unfinished audit has prompts with one run."""
    from rlcurate.audit.summary import summarize

    rng = np.random.default_rng(5)
    _, k, n = piles_and_spread(rng, 120)
    rows = [[1.0] * ki + [0.0] * (8 - ki) for ki in k]
    rows[:7] = [r[:1] for r in rows[:7]]  # an unfinished audit: seven prompts with one run so far
    audit = write_audit(tmp_path / "audit", rows)
    assert main(["advise", str(audit), "--no-sim", "--json"]) == 0
    advised = {row["G"]: row for row in json.loads(capsys.readouterr().out)["gate"]}
    gate = summarize(audit)["gate"]["by_group_size"]
    for G, row in advised.items():
        assert gate[str(G)]["share"] == pytest.approx(1 - row["zero_variance"], abs=1e-9)
        assert gate[str(G)]["source"] == ("measured" if row["measured"] else "fit")
    assert gate["8"]["source"] == "measured"  # the one-run prompts do not pull the measured range down to G = 1


def test_a_scores_file_from_your_own_harness_is_read_as_an_audit(tmp_path, capsys):
    """The same pool as an audit folder, as .jsonl with rewards, as .jsonl with counts and as .csv: the same fit
    and gate; the advice goes next to the file; --out-of-reach-from takes a file too."""
    rng = np.random.default_rng(11)
    _, k, n = piles_and_spread(rng, 60)
    runs = [[1.0] * ki + [0.0] * (8 - ki) for ki in k]
    folder = write_audit(tmp_path / "audit", runs)
    rewards = tmp_path / "rewards" / "eval.jsonl"
    rewards.parent.mkdir()
    rewards.write_text("".join(json.dumps({"uid": f"q{i}", "rewards": r, "prompt": "..."}) + "\n"
                               for i, r in enumerate(runs)) + "\n")
    counts = tmp_path / "counts.jsonl"
    counts.write_text("".join(json.dumps({"id": i, "successes": int(ki), "trials" if i % 2 else "n_runs": 8}) + "\n"
                              for i, ki in enumerate(k)))  # n_runs, as an audit's samples.jsonl names it
    table = tmp_path / "table.csv"
    table.write_text("\ufeffuid,successes,trials\n" + "".join(f"q{i},{ki},8\n" for i, ki in enumerate(k)))
    gates = []
    for source in (folder, rewards, counts, table):
        assert main(["advise", str(source), "--no-sim", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["prompts"] == 60 and out["runs"] == 8
        gates.append([(r["G"], r["zero_variance"], r["low"], r["high"]) for r in out["gate"]])
    assert gates[1] == gates[0] and gates[2] == gates[0] and gates[3] == gates[0]
    assert load_pool(table).uids[:2] == ["q0", "q1"]  # the byte-order mark is not part of the first column's name
    assert (rewards.parent / "advice_gate.json").is_file()  # next to the file
    later = tmp_path / "later.jsonl"  # a later checkpoint's results on the same prompts: half of them never solved
    later.write_text("".join(json.dumps({"uid": f"q{i}", "rewards": [float(i % 2)] * 4}) + "\n" for i in range(60)))
    share, note, warnings = never_solved_share(rewards, later)
    assert share == 0.5 and "30 of 60 prompts never solved" in note and not warnings


def test_a_scores_file_suffix_in_capitals_is_read(tmp_path):
    path = tmp_path / "EVAL.JSONL"
    path.write_text("".join(json.dumps({"uid": f"q{i}", "rewards": [1, 0, 1, 1], "successes": 3, "trials": 4}) + "\n"
                            for i in range(30)))
    assert load_pool(path).uids == [f"q{i}" for i in range(30)]


def test_prompts_without_ids_are_numbered_alike_in_jsonl_and_csv(tmp_path):
    """Without ids a prompt is its position among the file's prompts, whatever the format (blank lines and the
    header not counted), so a .csv and a .jsonl of the same prompts match, with a warning that they are matched by
    position; a JSON string holding U+2028 does not split its line."""
    rng = np.random.default_rng(3)
    _, k, _ = piles_and_spread(rng, 40)
    start = tmp_path / "start.csv"
    start.write_text("successes,trials\n" + "".join(f"{ki},8\n" for ki in k))
    later = tmp_path / "later.jsonl"
    later.write_text("\n" + "".join(json.dumps({"rewards": [float(i % 2)] * 4, "note": "a\u2028b"}, ensure_ascii=False)
                                    + "\n" for i in range(40)))
    assert load_pool(start).uids == load_pool(later).uids == [str(i) for i in range(1, 41)]
    share, note, warnings = never_solved_share(start, later)
    assert share == 0.5 and "20 of 40 prompts never solved" in note
    assert any("start.csv and " in w and "later.jsonl name prompts without ids: they are matched by their position" in w
               for w in warnings)


@pytest.mark.parametrize("name,text,needle", [
    ("a.jsonl", '{"uid": "a", "rewards": [1, 0]}\nnot json\n', "a.jsonl: line 2: not JSON"),
    ("b.jsonl", '[1, 0]\n', "b.jsonl: line 1: a JSON object per line, got list"),
    ("c.jsonl", '{"uid": "a"}\n', "c.jsonl: line 1: no 'rewards' (a list of 0/1 per run) and no 'successes' with"),
    ("d.jsonl", '{"uid": "a", "rewards": [1, "x"]}\n', "d.jsonl: line 1: rewards must be a list of finite numbers"),
    ("e.jsonl", '{"uid": "a", "successes": 5, "trials": 4}\n', "e.jsonl: line 1: successes 5 > trials 4"),
    ("f.jsonl", '{"uid": "a", "rewards": [1, 0]}\n{"uid": "a", "rewards": [0, 0]}\n',
     "f.jsonl: line 2: uid 'a' again (first on line 1)"),
    ("g.csv", "uid,passed,total\na,1,2\n", "g.csv: the header must name successes and trials"),
    ("h.csv", "uid,successes,trials\na,1,2\nb,one,2\n", "h.csv: line 3: successes must be a whole number >= 0, got 'one'"),
    ("i.csv", "uid,successes,trials\na,1.5,2\n", "i.csv: line 2: successes must be a whole number >= 0, got 1.5"),
    ("j.jsonl", "\n\n", "j.jsonl: no prompts in it"),
    ("n.csv", "uid,successes,trials\nq1,2,8,\n", "n.csv: line 2: more fields than the header's 3"),
    ("o.jsonl", '{"uid": "a", "successes": 1, "trials": 1e12}\n', "o.jsonl: line 1: trials 1,000,000,000,000 is "
                                                                  "more than 1,000,000 runs of one prompt"),
    ("p.csv", "successes,trials\n" + "1,1000000\n" * 51, "p.csv: line 52: the prompts up to here claim 51,000,000 "
                                                           "runs, more than 50,000,000 in one file"),
    ("q.csv", 'uid,successes,trials\na,1,2\n"two\nlines",1,2\nb,3,2\n', "q.csv: line 3: a field runs over several "
                                                                        "lines (an unclosed quote?)"),
    ("r.csv", 'uid,successes,trials\na,1,2\n"b,1,2\nc,1,2\nd,1,2\n', "r.csv: line 3: a field runs over several lines"),
    ("s.csv", "uid,successes,trials\n\n\na,1,2\n\nb,3,2\n", "s.csv: line 6: successes 3 > trials 2"),
    ("t.csv", 'uid,successes,trials\na,1,"' + "9" * 140_000 + '"\n', "t.csv: line 2: not readable as CSV (field "
                                                                       "larger than field limit"),
    ("u.jsonl", '{"uid": "a", "successes": 1, "trials": ' + "9" * 400 + "}\n",
     "u.jsonl: line 1: trials a number of 400 digits is more than 1,000,000 runs of one prompt"),
    ("v.jsonl", '{"uid": "a", "successes": 1, "trials": ' + "9" * 5000 + "}\n", "v.jsonl: line 1: not JSON (Exceeds "
                                                                               "the limit (4300 digits)"),
    ("w.jsonl", '{"uid": "a", "rewards": [1, 0], "successes": 2, "trials": 4}\n',
     "w.jsonl: line 1: successes 2 and trials 4 disagree with its rewards (1 of 2 right); give one or the other"),
    ("x.jsonl", '{"uid": "a", "rewards": [true, false]}\n', "x.jsonl: line 1: rewards must be a list of finite "
                                                            "numbers, got [true, false]"),
    ("k.jsonl", None, "k.jsonl: no such file"),
    ("l.json", '{"uid": "a"}', "l.json: a file, not an audit folder (give the folder an `rlcurate audit --out` wrote, "
                               "or a scores file ending in .jsonl or .csv)"),
    ("m.jsonl", "".join(f'{{"uid": {i}, "rewards": [0.5, 1, 0]}}\n' for i in range(30)), "graded rewards"),
])
def test_bad_scores_files_are_refused_in_one_line(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    _one_line_error(capsys, ["advise", str(path), "--no-sim"], needle)
