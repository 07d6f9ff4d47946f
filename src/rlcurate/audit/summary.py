"""Summarising a variance audit from its ``runs.jsonl`` (chapter 4, *The variance audit*).

:func:`load_audit` turns an audit folder into a score matrix (one row per sample, runs in order);
:func:`summarize` computes what the chapter reads off it:

* per sample: mean, best, worst, variance and standard deviation of the N scores, and its category
  (always right, always wrong, mixed);
* best-of-N against the mean (the improvement potential) and the pass@k curve;
* the share of mixed samples with a Beta credible interval;
* how far to trust a zero-variance verdict: a prompt with pass rate p agrees on all N runs with
  probability p^N + (1-p)^N. A beta-binomial fit of the pass rates (empirical Bayes) gives the share
  of prompts drawn from it that look uniform in N runs, and the chance that a uniform sample would
  turn mixed with m more runs; a degenerate fit is reported as such;
* what invalidates the audit: runs whose reward function failed, and runs that hit
  ``max_new_tokens`` and failed. Above :data:`INVALIDATING_SHARE` of the runs the verdict says that
  the audit measures the reward function or the token limit, not the data, and gives no advice on
  the data;
* the verdict on the mixed share, which says when its interval straddles :data:`SCARCE_MIXED_SHARE`;
* the gate by group size, the share of prompts whose group of G rollouts is mixed (measured for
  G <= N, extrapolated beyond by the Beta-mixture fit that ``rlcurate advise`` uses,
  :mod:`rlcurate.stats.mixture`), and what doubling the group would buy. Chapter 4 shows that
  the recipe's multiplier rule, keyed on the mixed share alone, is not well defined; the summary
  does not use it.

Writing the files and the printed report is :mod:`rlcurate.audit.report`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats as _sps

from rlcurate.audit.config import AuditError
from rlcurate.audit.store import RUNS_FILE, SESSIONS_FILE, read_config, read_runs
from rlcurate.stats.mixture import GROUP_SIZES, MIN_RUNS, BetaMixture, fit_beta_mixture, gate_counts
from rlcurate.stats import (
    category_counts,
    categorize,
    fit_beta_prior,
    group_mixed_prob,
    hidden_signal_prob,
    improvement_potential,
    pass_at_k_curve,
    prior_degeneracy,
    runs_needed,
    sample_metrics,
    share_interval,
    threshold_side,
)

log = logging.getLogger(__name__)

__all__ = ["Audit", "load_audit", "summarize", "INVALIDATING_SHARE", "SCARCE_MIXED_SHARE", "GROUP_SIZES",
           "beta_uniform_prob"]

SUMMARY_FORMAT = "rlcurate-audit-summary/2"
INVALIDATING_SHARE = 0.10
"""When more than this share of the runs had a failing reward function, or hit ``max_new_tokens``
and failed, the categories measure the reward function or the token limit rather than the model on
the data: the verdict says so first and the summary gives no advice on the data. (A run that hit the
limit and still succeeded was not hurt by it, so truncation counts only failed runs here.)"""
SCARCE_MIXED_SHARE = 0.10
"""Below this share of mixed prompts, groups of N rollouts learn from few prompts of the data set;
the verdict says so, or that it cannot tell when the interval of the share straddles it."""
REWARD_ERROR_PREFIXES = ("reward error", "verifier error", "verifier returned")
"""Reasons of failed reward functions in audits written before runs carried ``reward_error``."""


@dataclass
class Audit:
    """An audit read back from its folder (chapter 4).

    Attributes:
        config: the audit configuration (``config.json``'s ``config``).
        uids: sample uids in audit order, one per row of ``scores`` (samples without any run left out).
        index: each row's position in the audit order.
        scores: one array of scores per sample, runs in order.
        n_tokens, finish_reasons, reasons, completions: per run, in the same layout.
        n_samples: samples the audit covers (its ``limit``); ``len(uids) < n_samples`` while unfinished.
        sessions: the records of ``sessions.jsonl``.
    """

    config: dict
    uids: list[str]
    index: list[int]
    scores: list[np.ndarray]
    n_tokens: list[np.ndarray]
    finish_reasons: list[list[str]]
    reasons: list[list[str]]
    completions: list[list[str]]
    n_samples: int
    sessions: list[dict]
    info: dict
    errors: list[np.ndarray] = field(default_factory=list)
    """Per run, whether its reward function failed (same layout as ``scores``)."""

    @property
    def runs(self) -> int:
        """The number of runs per sample the audit asks for, N."""
        return int(self.config["runs"])

    @property
    def complete(self) -> bool:
        """True when every sample has all N runs."""
        return len(self.uids) == self.n_samples and all(s.size == self.runs for s in self.scores)

    def first_runs(self, n: int) -> "Audit":
        """The audit an ``n``-run audit of the same samples would have given: the first ``n`` runs of
        every sample (each run is an independent draw, so any ``n`` of them are an ``n``-run audit)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.runs:
            raise ValueError(f"n must be an integer in 1..{self.runs}, got {n!r}")
        return dataclasses.replace(
            self, config={**self.config, "runs": n}, scores=[s[:n] for s in self.scores],
            n_tokens=[t[:n] for t in self.n_tokens], finish_reasons=[f[:n] for f in self.finish_reasons],
            reasons=[r[:n] for r in self.reasons], completions=[c[:n] for c in self.completions], sessions=[],
            errors=[e[:n] for e in self.errors])

    def successes(self) -> np.ndarray:
        """Runs per sample whose score reaches the success threshold."""
        thr = float(self.config.get("success_threshold", 1.0))
        return np.array([int((s >= thr).sum()) for s in self.scores])


def load_audit(out_dir) -> Audit:
    """Read an audit folder (chapter 4). Samples are in audit order and runs in run order, whatever
    order the lines were written in; a truncated last line is ignored."""
    out = Path(out_dir)
    info = read_config(out)
    config = info["config"]
    n_samples = int(info.get("n_samples", len(info["samples"])))
    uids_all = info["samples"][:n_samples]
    records, _ = read_runs(out / RUNS_FILE)
    runs_n = int(config["runs"])
    by_sample: dict[int, dict[int, dict]] = {}
    for r in records:
        i = r["index"]
        if i >= n_samples or r["run"] >= runs_n:
            continue
        if uids_all[i] != r["uid"]:
            raise AuditError(f"{out / RUNS_FILE}: sample {i} has uid {r['uid']!r}, config says {uids_all[i]!r}")
        by_sample.setdefault(i, {})[r["run"]] = r
    idx = sorted(by_sample)
    rows = [[by_sample[i][k] for k in sorted(by_sample[i])] for i in idx]
    sessions = []
    sp = out / SESSIONS_FILE
    if sp.exists():
        for line in sp.read_bytes().decode("utf-8", errors="replace").splitlines():
            try:
                sessions.append(json.loads(line))
            except ValueError:  # an interrupted session line: timing only, not results
                continue
    return Audit(
        config=config, uids=[uids_all[i] for i in idx], index=idx,
        scores=[np.array([r["score"] for r in row], dtype=float) for row in rows],
        n_tokens=[np.array([r["n_tokens"] for r in row], dtype=int) for row in rows],
        finish_reasons=[[r["finish_reason"] for r in row] for row in rows],
        reasons=[[r["reason"] for r in row] for row in rows],
        completions=[[r["completion"] for r in row] for row in rows],
        n_samples=n_samples, sessions=sessions, info=info,
        errors=[np.array([bool(r.get("reward_error", r["reason"].startswith(REWARD_ERROR_PREFIXES))) for r in row],
                         dtype=bool) for row in rows],
    )


def beta_uniform_prob(n, a: float, b: float):
    """E[p^n + (1-p)^n] for p ~ Beta(a, b) (chapter 4): the chance that a prompt drawn from the prior
    agrees on all n runs, = [B(a+n, b) + B(a, b+n)] / B(a, b); the one-component case of
    :meth:`BetaMixture.zero_variance <rlcurate.stats.mixture.BetaMixture.zero_variance>`."""
    return BetaMixture(np.ones(1), np.array([float(a)]), np.array([float(b)])).zero_variance(n)


def _round(x, nd=12):
    """Round floats so that summaries compare equal across platforms' last-bit noise."""
    if isinstance(x, dict):
        return {k: _round(v, nd) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v, nd) for v in x]
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return round(v, nd) if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.ndarray):
        return _round(x.tolist(), nd)
    return x


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summarize(audit, extra_runs: int = 4, level: float = 0.95, miss: float = 0.05,
              group_size: int | None = None) -> dict:
    """The summary of an audit (a folder or an :class:`Audit`) as a JSON-ready dict (chapter 4).

    Everything except the ``timing`` entry is a deterministic function of the recorded runs, so a
    resumed audit and an uninterrupted one with the same seed have equal summaries without it.

    Args:
        extra_runs: m in the hidden-signal estimate (chance that a uniform sample turns mixed with m
            more runs).
        level: the credible level of the mixed-share interval (and of the mean's interval).
        miss: the tolerated chance of calling a mixed prompt uniform, for ``runs_needed``.
        group_size: the group size G that training will use, for the advice (default: the audit's N).
    """
    if not isinstance(audit, Audit):
        audit = load_audit(audit)
    if not audit.scores:
        raise AuditError("the audit holds no finished runs yet; nothing to summarise")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2):
        raise AuditError(f"group_size must be an integer >= 2, got {group_size!r}")
    cfg = audit.config
    thr = float(cfg.get("success_threshold", 1.0))
    N = audit.runs
    scores = audit.scores
    m = sample_metrics(scores)
    cats = categorize(scores, success=thr)
    counts = category_counts(scores, success=thr)
    n = len(scores)
    imp = improvement_potential(scores)
    all_scores = np.concatenate(scores)
    binary = bool(np.isin(all_scores, (0.0, 1.0)).all())
    k = audit.successes()
    trials = np.array([s.size for s in scores])
    ks = [2**j for j in range(int(np.log2(trials.min())) + 1)]
    if trials.min() not in ks:
        ks.append(int(trials.min()))
    curve = pass_at_k_curve(scores, ks, threshold=thr)
    mixed = share_interval(counts["mixed"], n, level=level)
    z = float(_sps.norm.ppf((1 + level) / 2))
    half = z * float(m["mean"].std()) / math.sqrt(n)

    reliability: dict = {"runs": N, "miss": miss, "extra_runs": int(extra_runs),
                         "p_zero_variance": {str(p): float(p**N + (1 - p) ** N) for p in (0.05, 0.1, 0.25, 0.5)},
                         "runs_needed": {str(p): int(runs_needed(p, miss)) for p in (0.02, 0.05, 0.1, 0.25, 0.5)}}
    prior = None
    if N >= 2 and n >= 2 and len(np.unique(k / trials)) > 1:
        a, b = fit_beta_prior(k, trials)
        degenerate = prior_degeneracy(a, b)
        reliability["prior"] = {"a": a, "b": b, "mean": a / (a + b), "degenerate": degenerate}
        if degenerate is None:
            prior = (a, b)
            h_wrong = hidden_signal_prob(N, False, extra_runs, prior)
            h_right = hidden_signal_prob(N, True, extra_runs, prior)
            reliability.update({
                # share of prompts from the fitted prior (all of them truly mixed, 0 < p < 1) that look
                # uniform in N runs, E[p^N + (1-p)^N]
                "uniform_share_of_truly_mixed": beta_uniform_prob(N, a, b),
                "hidden_signal": {"always_wrong": h_wrong, "always_right": h_right},
                "expected_hidden_mixed": counts["always_wrong"] * h_wrong + counts["always_right"] * h_right,
            })
    else:
        reliability["prior"] = None  # one run, or every sample has the same pass rate: no spread to fit

    total = int(trials.sum())
    err_rows = audit.errors or [np.array([r.startswith(REWARD_ERROR_PREFIXES) for r in row], dtype=bool)
                                for row in audit.reasons]
    errors = np.concatenate(err_rows)
    first_error = next((r for row, e in zip(audit.reasons, err_rows) for r, f in zip(row, e) if f), None)
    # runs scored 0 by on_reward_error="zero"; "stop" ends the audit before a failed batch is written
    reward_errors = {"runs": int(errors.sum()), "share": float(errors.mean()), "first": first_error}
    finish = [f for row in audit.finish_reasons for f in row]
    hit = np.array([f == "length" for f in finish], dtype=bool)
    failed = all_scores < thr
    truncation = {"runs": int(hit.sum()), "share": float(hit.mean()), "failed_runs": int((hit & failed).sum()),
                  "failed_share": float((hit & failed).mean()), "max_new_tokens": cfg.get("max_new_tokens")}

    G = int(group_size or N)
    gate = None if N < 2 else _gate_by_group_size(scores, k, trials, binary, G)
    verdict = _verdict(N, counts, mixed, reward_errors, truncation, total)
    advice = _advice(gate, G) if verdict["data_advice"] else None

    tokens = np.concatenate(audit.n_tokens)
    hist = {str(j): int((k == j).sum()) for j in range(N + 1)} if (trials == N).all() else None
    summary = {
        "format": SUMMARY_FORMAT,
        "config": {key: cfg[key] for key in ("model", "task", "task_kwargs", "split", "runs", "limit", "seed",
                                               "temperature", "top_p", "top_k", "max_new_tokens", "chunk_size",
                                               "success_threshold", "backend") if key in cfg},
        "n_samples": audit.n_samples,
        "n_audited": n,
        "n_runs": total,
        "complete": audit.complete,
        "binary_scores": binary,
        "verdict": verdict,
        "mean": imp["mean"],
        "mean_interval": {"low": max(0.0, imp["mean"] - half), "high": imp["mean"] + half, "level": level},
        "best_of_n": imp["best_of_n"],
        "gain": imp["gain"],
        "relative_gain": imp["relative_gain"] if math.isfinite(imp["relative_gain"]) else None,
        "worst_of_n": float(m["worst"].mean()),
        "mean_std": float(m["std"].mean()),
        "categories": counts,
        "category_shares": {c: counts[c] / n for c in counts},
        "mixed_share": mixed,
        "pass_count_hist": hist,
        "pass_at_k": {"k": [int(x) for x in curve["k"]], "pass_at_k": [float(x) for x in curve["pass_at_k"]]},
        "reward_errors": reward_errors,
        "truncation": truncation,
        "reliability": reliability,
        "gate": gate,
        "advice": advice,
        "finish_reasons": {f: finish.count(f) for f in sorted(set(finish))},
        "mean_tokens": float(tokens.mean()),
        "generated_tokens": int(tokens.sum()),
        "timing": _timing(audit, tokens),
    }
    assert sum(counts.values()) == n and (cats == "mixed").sum() == counts["mixed"]
    return _round(summary)


def _gate_by_group_size(scores, k, trials, binary: bool, G: int) -> dict:
    """The share of prompts whose group of g rollouts is mixed, for g in :data:`GROUP_SIZES` and G, 2G, read
    from the prompts with :data:`~rlcurate.stats.mixture.MIN_RUNS` or more runs (:func:`~rlcurate.stats.mixture.gate_counts`, as ``rlcurate advise``
    reads them): measured without bias for g up to their fewest runs (:func:`~rlcurate.stats.group_mixed_prob`),
    extrapolated beyond by the Beta-mixture fit that advise uses (1 - E[p^g + (1-p)^g]), so the two report the
    same numbers. No extrapolation (``share`` None, ``why`` says) for graded scores, which the pass/fail fit
    does not model, or when no prompt's runs disagree, which leaves nothing between 0 and 1 to fit."""
    kg, ng = gate_counts(k, trials)
    rows = [s for s in scores if s.size >= MIN_RUNS]
    why = None
    if not binary:
        why = "the scores are graded and the fit models pass/fail rewards"
    elif not ((kg > 0) & (kg < ng)).any():
        why = "no prompt's runs disagree, so there is nothing between 0 and 1 to extrapolate from"
    fit = fit_beta_mixture(kg, ng) if why is None else None
    shortest = int(ng.min()) if ng.size else 0
    out = {}
    for g in sorted({*GROUP_SIZES, G, 2 * G}):
        if g <= shortest:
            out[str(g)] = {"share": float(group_mixed_prob(rows, g).mean()), "source": "measured"}
        elif fit is not None:
            out[str(g)] = {"share": float(1 - fit.zero_variance(g)), "source": "fit"}
        else:
            out[str(g)] = {"share": None, "source": None}
    return {"group_size": G, "by_group_size": out, "no_fit": why}


def _verdict(N: int, counts: dict, mixed: dict, errors: dict, truncation: dict, total: int) -> dict:
    """What the audit can be trusted to say, most important first (chapter 4). The problems that
    invalidate it, in this order: a failing reward function, runs cut off by the token limit, one run
    per sample; all of them are named, and then the summary gives no advice on the data. Otherwise
    the mixed share against :data:`SCARCE_MIXED_SHARE`, saying so when its interval straddles it."""
    lvl = f"{int(round(100 * mixed['level']))}% interval {100 * mixed['low']:.1f}-{_pct(mixed['high'])}"
    problems = []
    if errors["share"] > INVALIDATING_SHARE:
        first = f" (first: {errors['first']})" if errors["first"] else ""
        problems.append(("reward_errors", (
            f"the audit measures the reward function, not the data: it failed on {errors['runs']} of {total} runs "
            f"({_pct(errors['share'])}), which scored 0{first}; fix it and audit again into a new --out folder")))
    if truncation["failed_share"] > INVALIDATING_SHARE:
        problems.append(("truncation", (
            f"the audit measures the token limit, not the data: {truncation['failed_runs']} of {total} runs "
            f"({_pct(truncation['failed_share'])}) hit max_new_tokens={truncation['max_new_tokens']} and failed; "
            "raise --max-new-tokens (or add --stop strings) and audit again into a new --out folder")))
    if N == 1:
        problems.append(("one_run", (
            "1 run per sample cannot tell mixed prompts from uniform ones (a single run always agrees with "
            "itself): the categories only split right from wrong; audit with --runs 2 or more (a prompt of "
            "pass rate p needs about 3/p runs to show as mixed, chapter 4)")))
    if problems:
        return {"code": problems[0][0], "problems": [c for c, _ in problems], "data_advice": False,
                "text": ". Also: ".join(t for _, t in problems)}
    side = threshold_side(mixed["low"], mixed["high"], SCARCE_MIXED_SHARE)
    bound = f"{100 * SCARCE_MIXED_SHARE:.0f}%"
    if side == "below":
        hard = "always wrong" if counts["always_wrong"] >= counts["always_right"] else "always right"
        code, text = "few_mixed", (
            f"fewer than {bound} of the prompts are mixed in {N} runs ({_pct(mixed['share'])}, {lvl}): groups of "
            f"{N} rollouts would learn from few of them; most uniform prompts are {hard} "
            f"({counts['always_wrong']} always wrong, {counts['always_right']} always right)")
    elif side == "straddles":
        code, text = "uncertain", (
            f"cannot tell whether fewer than {bound} of the prompts are mixed in {N} runs "
            f"({_pct(mixed['share'])}, {lvl}); audit more prompts to narrow the interval")
    else:
        code, text = "mixed", f"{_pct(mixed['share'])} of the prompts are mixed in {N} runs ({lvl}), more than {bound}"
    return {"code": code, "problems": [], "data_advice": True, "text": text}


def _advice(gate: dict | None, G: int) -> dict | None:
    """What doubling the group from G to 2G would buy, keyed on the gate (chapter 4): the share of
    prompts with a mixed group at G and 2G, and mixed prompts per 100 rollouts, which never grow
    with G (chapter 1)."""
    if gate is None:
        return None
    now, doubled = gate["by_group_size"][str(G)], gate["by_group_size"][str(2 * G)]
    out = {"group_size": G, "doubled": 2 * G, "share": now["share"], "share_doubled": doubled["share"],
           "source": now["source"], "source_doubled": doubled["source"]}
    no_shape = gate["no_fit"]  # set whenever a share is None
    if now["share"] is None:
        out["text"] = f"no prediction for groups of {G} (more than the audit's runs): {no_shape}; audit with --runs {G} to measure it"
        return out
    per, per2 = 100 * now["share"] / G, None if doubled["share"] is None else 100 * doubled["share"] / (2 * G)
    out.update(per_100_rollouts=per, per_100_rollouts_doubled=per2)
    source = {"measured": "measured", "fit": "extrapolated by the Beta-mixture fit"}
    head = f"groups of {G} rollouts: {_pct(now['share'])} of the prompts mixed ({source[now['source']]})"
    if doubled["share"] is None:
        out["text"] = (f"{head}; larger groups cannot be predicted: {no_shape}; re-audit the uniform prompts with "
                       "more runs to see whether they hide signal (chapter 4)")
        return out
    out["text"] = (f"{head}; groups of {2 * G} would make {_pct(doubled['share'])} mixed ({source[doubled['source']]}) "
                   f"at twice the rollouts, and mixed prompts per 100 rollouts go from {per:.1f} to {per2:.1f}. More "
                   "rollouts per prompt pay only when prompts, not rollouts, are scarce; prompts truly always right or "
                   "wrong need other data or hints (chapter 7)")
    return out


def _timing(audit: Audit, tokens: np.ndarray) -> dict:
    """Wall times summed over the audit's sessions; throughput over the generation time."""
    s = audit.sessions
    wall = float(sum(x.get("wall_s", 0.0) for x in s))
    gen = float(sum(x.get("generate_s", 0.0) for x in s))
    load = float(sum(x.get("load_s", 0.0) for x in s))
    n_runs = int(sum(x.size for x in audit.scores))
    out = {"sessions": len(s), "wall_s": wall, "load_s": load, "generate_s": gen,
           "device": audit.info.get("device")}
    if gen > 0:  # a sample is N runs; throughput while generating, and over the wall time
        out.update(samples_per_s=n_runs / audit.runs / gen, runs_per_s=n_runs / gen,
                   tokens_per_s=float(tokens.sum()) / gen, samples_per_s_wall=n_runs / audit.runs / wall)
    return out
