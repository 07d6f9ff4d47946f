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
  turn mixed with m more runs;
* the rule-of-thumb compute multiplier and the thresholds it uses.

:func:`write_summary` writes ``summary.json``, ``samples.jsonl`` (per-sample metrics),
``mixed.jsonl`` (the mixed subset as ``{"uid", "mean", "n_runs"}`` lines, the format the
``prefilter`` curation strategy reads) and the two figures.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import special

from rlcurate.audit.runner import RUNS_FILE, SESSIONS_FILE, AuditError, read_config, read_runs
from rlcurate.stats import (
    category_counts,
    categorize,
    compute_multiplier_advice,
    fit_beta_prior,
    gate_open_prob,
    hidden_signal_prob,
    improvement_potential,
    pass_at_k_curve,
    runs_needed,
    sample_metrics,
    share_interval,
)

__all__ = ["Audit", "load_audit", "summarize", "write_summary", "MULTIPLIER_THRESHOLDS", "SUMMARY_FILE",
           "SAMPLES_FILE", "MIXED_FILE", "VARIANCE_PLOT", "HISTOGRAM_PLOT", "beta_uniform_prob"]

SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.jsonl"
MIXED_FILE = "mixed.jsonl"
VARIANCE_PLOT = "variance.png"
HISTOGRAM_PLOT = "pass_rates.png"
SUMMARY_FORMAT = "rlcurate-audit-summary/1"
# Mixed-share boundaries of compute_multiplier_advice: <10% warning, 10-15% 2-4x, 15-30% 1-2x, >30% 1x.
MULTIPLIER_THRESHOLDS = (0.10, 0.15, 0.30)


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
            reasons=[r[:n] for r in self.reasons], completions=[c[:n] for c in self.completions], sessions=[])

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
        for line in sp.read_text().splitlines():
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
    )


def beta_uniform_prob(n, a: float, b: float):
    """E[p^n + (1-p)^n] for p ~ Beta(a, b) (chapter 4): the chance that a prompt drawn from the prior
    agrees on all n runs, = [B(a+n, b) + B(a, b+n)] / B(a, b)."""
    n = np.asarray(n, dtype=float)
    base = special.betaln(a, b)
    out = np.exp(special.betaln(a + n, b) - base) + np.exp(special.betaln(a, b + n) - base)
    return float(out) if out.ndim == 0 else out


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


def summarize(audit, extra_runs: int = 4, level: float = 0.95, miss: float = 0.05) -> dict:
    """The summary of an audit (a folder or an :class:`Audit`) as a JSON-ready dict (chapter 4).

    Everything except the ``timing`` entry is a deterministic function of the recorded scores, so a
    resumed audit and an uninterrupted one with the same seed have equal summaries without it.

    Args:
        extra_runs: m in the hidden-signal estimate (chance that a uniform sample turns mixed with m
            more runs).
        level: the credible level of the mixed-share interval.
        miss: the tolerated chance of calling a mixed prompt uniform, for ``runs_needed``.
    """
    if not isinstance(audit, Audit):
        audit = load_audit(audit)
    if not audit.scores:
        raise AuditError("the audit holds no finished runs yet; nothing to summarise")
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

    reliability: dict = {"runs": N, "miss": miss, "extra_runs": int(extra_runs),
                         "p_zero_variance": {str(p): float(p**N + (1 - p) ** N) for p in (0.05, 0.1, 0.25, 0.5)},
                         "runs_needed": {str(p): int(runs_needed(p, miss)) for p in (0.02, 0.05, 0.1, 0.25, 0.5)}}
    if n >= 2 and len(np.unique(k / trials)) > 1:
        a, b = fit_beta_prior(k, trials)
        h_wrong = hidden_signal_prob(N, False, extra_runs, (a, b))
        h_right = hidden_signal_prob(N, True, extra_runs, (a, b))
        n_grid = [2, 3, 4, 5, 8, 16, 32, 64]
        reliability.update({
            "prior": {"a": a, "b": b, "mean": a / (a + b)},
            # share of prompts from the fitted prior (all of them truly mixed, 0 < p < 1) that look
            # uniform in N runs, E[p^N + (1-p)^N]
            "uniform_share_of_truly_mixed": beta_uniform_prob(N, a, b),
            "hidden_signal": {"always_wrong": h_wrong, "always_right": h_right},
            "expected_hidden_mixed": counts["always_wrong"] * h_wrong + counts["always_right"] * h_right,
            "predicted_mixed_share": {str(g): float(1 - beta_uniform_prob(g, a, b)) for g in n_grid},
        })
    else:
        reliability["prior"] = None  # every sample has the same pass rate: no spread to fit

    advice = compute_multiplier_advice(mixed["share"])
    advice = {**advice, "multiplier": list(advice["multiplier"]) if advice["multiplier"] else None,
              "thresholds": list(MULTIPLIER_THRESHOLDS), "mixed_share": mixed["share"], "runs": N}

    reasons = [r for row in audit.reasons for r in row]
    finish = [f for row in audit.finish_reasons for f in row]
    tokens = np.concatenate(audit.n_tokens)
    hist = {str(j): int((k == j).sum()) for j in range(N + 1)} if (trials == N).all() else None
    summary = {
        "format": SUMMARY_FORMAT,
        "config": {key: cfg[key] for key in ("model", "task", "task_kwargs", "split", "runs", "limit", "seed",
                                               "temperature", "top_p", "top_k", "max_new_tokens", "chunk_size",
                                               "success_threshold", "backend") if key in cfg},
        "n_samples": audit.n_samples,
        "n_audited": n,
        "n_runs": int(trials.sum()),
        "complete": audit.complete,
        "binary_scores": binary,
        "mean": imp["mean"],
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
        "reliability": reliability,
        "advice": advice,
        "reward_errors": sum(r.startswith("reward error") for r in reasons),
        "finish_reasons": {f: finish.count(f) for f in sorted(set(finish))},
        "mean_tokens": float(tokens.mean()),
        "generated_tokens": int(tokens.sum()),
        "timing": _timing(audit, tokens),
    }
    assert sum(counts.values()) == n and (cats == "mixed").sum() == counts["mixed"]
    return _round(summary)


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


def per_sample_rows(audit: Audit) -> list[dict]:
    """One dict per audited sample: uid, position, runs, mean, best, worst, variance, std, successes,
    category (the content of ``samples.jsonl``)."""
    thr = float(audit.config.get("success_threshold", 1.0))
    m = sample_metrics(audit.scores)
    cats = categorize(audit.scores, success=thr)
    k = audit.successes()
    return [{"index": int(audit.index[j]), "uid": audit.uids[j], "n_runs": int(m["n_runs"][j]),
             "mean": float(m["mean"][j]), "best": float(m["best"][j]), "worst": float(m["worst"][j]),
             "variance": float(m["variance"][j]), "std": float(m["std"][j]), "successes": int(k[j]),
             "category": str(cats[j])} for j in range(len(audit.uids))]


def write_summary(out_dir, extra_runs: int = 4, plots: bool = True, level: float = 0.95) -> dict:
    """Summarise the audit in ``out_dir`` and write ``summary.json``, ``samples.jsonl``,
    ``mixed.jsonl`` and (with ``plots``) ``variance.png`` and ``pass_rates.png`` (chapter 4).
    Returns the summary."""
    out = Path(out_dir)
    audit = load_audit(out)
    summary = summarize(audit, extra_runs=extra_runs, level=level)
    rows = per_sample_rows(audit)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    (out / SAMPLES_FILE).write_text("".join(json.dumps(_round(r)) + "\n" for r in rows))
    (out / MIXED_FILE).write_text("".join(
        json.dumps({"uid": r["uid"], "mean": _round(r["mean"]), "n_runs": r["n_runs"]}) + "\n"
        for r in rows if r["category"] == "mixed"))
    if plots:
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from rlcurate.audit.plots import plot_pass_rate_hist, plot_variance
        from rlcurate.book.style import use_style

        use_style(inline=False)
        title = f"{Path(str(audit.config['model'])).name} on {audit.config['task']} ({audit.runs} runs)"
        fig = plot_variance(audit.scores, title=title)
        fig.savefig(out / VARIANCE_PLOT, metadata={"Software": None})
        plt.close(fig)
        fig = plot_pass_rate_hist(audit.scores, runs=audit.runs,
                                  threshold=float(audit.config.get("success_threshold", 1.0)), title=title)
        fig.savefig(out / HISTOGRAM_PLOT, metadata={"Software": None})
        plt.close(fig)
    return summary


def format_summary(summary: dict) -> str:
    """A short human-readable report of a summary (what ``rlcurate audit`` prints)."""
    c, s, r = summary["categories"], summary["mixed_share"], summary["reliability"]
    n = summary["n_audited"]
    N = summary["config"]["runs"]
    lines = [
        f"{n} samples x {N} runs ({summary['n_runs']} runs{'' if summary['complete'] else ', INCOMPLETE'})",
        f"  always right {c['always_right']}, always wrong {c['always_wrong']}, mixed {c['mixed']} "
        f"({100 * s['share']:.1f}%, {int(100 * s['level'])}% interval {100 * s['low']:.1f}-{100 * s['high']:.1f}%)",
        f"  mean {summary['mean']:.3f}, best-of-{N} {summary['best_of_n']:.3f}, gain {summary['gain']:+.3f}"
        + (f" ({100 * summary['relative_gain']:.0f}% relative)" if summary["relative_gain"] is not None else ""),
        "  pass@k: " + ", ".join(f"k={k_}: {v:.3f}" for k_, v in zip(summary["pass_at_k"]["k"],
                                                                   summary["pass_at_k"]["pass_at_k"])),
    ]
    if r.get("prior"):
        lines.append(
            f"  fitted prior Beta({r['prior']['a']:.3f}, {r['prior']['b']:.3f}): "
            f"{100 * r['uniform_share_of_truly_mixed']:.1f}% of prompts from it look uniform in {N} runs; "
            f"with {r['extra_runs']} more runs about {r['expected_hidden_mixed']:.1f} uniform samples would turn mixed")
    a = summary["advice"]
    lines.append(f"  advice ({a['verdict']}): {a['advice']}")
    t = summary.get("timing") or {}
    if t.get("runs_per_s"):
        lines.append(f"  time: {t['wall_s']:.1f} s wall over {t['sessions']} session(s), "
                     f"{t['runs_per_s']:.1f} runs/s while generating")
    return "\n".join(lines)
