"""Writing a variance audit's summary and printing its report (chapter 4, *The variance audit*).

:func:`write_summary` writes ``summary.json`` (:func:`rlcurate.audit.summary.summarize`),
``samples.jsonl`` (per-sample metrics), ``mixed.jsonl`` (the mixed subset, one line per sample with
``uid``, ``mean``, ``n_runs``, ``task``, ``split``, ``question`` and ``answer``; the ``prefilter``
curation strategy reads its ``uid`` and ``split``) and the two figures; :func:`format_summary` is what
``rlcurate audit`` prints, the verdict first.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlcurate.audit.config import AuditError
from rlcurate.audit.store import PROMPTS_FILE, RUNS_FILE
from rlcurate.audit.summary import Audit, _round, load_audit, summarize
from rlcurate.stats import categorize, sample_metrics

log = logging.getLogger(__name__)

__all__ = ["per_sample_rows", "write_summary", "format_summary", "SUMMARY_FILE", "SAMPLES_FILE", "MIXED_FILE",
           "VARIANCE_PLOT", "HISTOGRAM_PLOT"]

SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.jsonl"
MIXED_FILE = "mixed.jsonl"
VARIANCE_PLOT = "variance.png"
HISTOGRAM_PLOT = "pass_rates.png"


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


def _mixed_rows(out: Path, audit: Audit, rows: list[dict]) -> list[dict]:
    """The mixed samples with their question, reference answer, task and split (``mixed.jsonl``)."""
    cfg = audit.config
    text: dict[str, dict] = {}
    path = out / PROMPTS_FILE
    if path.is_file():
        for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
                text[row["uid"]] = row
            except (ValueError, KeyError, TypeError):
                continue
    mixed = [r for r in rows if r["category"] == "mixed"]
    if any(r["uid"] not in text for r in mixed):  # an audit from before prompts.jsonl: ask the task
        try:
            from rlcurate.tasks import get_task

            for p in get_task(cfg["task"], **cfg.get("task_kwargs", {})).problems(cfg["split"]):
                text.setdefault(p.uid, {"question": p.question, "answer": p.answer})
        except (ValueError, TypeError, OSError, ImportError) as exc:  # the data may have moved; the uids
            # are still what the prefilter needs
            log.warning("mixed.jsonl without questions: %s has no %s and the task cannot be read (%s)",
                        out, PROMPTS_FILE, exc)
    return [{"uid": r["uid"], "mean": _round(r["mean"]), "n_runs": r["n_runs"], "task": cfg["task"],
             "split": cfg["split"], "question": text.get(r["uid"], {}).get("question"),
             "answer": text.get(r["uid"], {}).get("answer")} for r in mixed]


def write_summary(out_dir, extra_runs: int = 4, plots: bool = True, level: float = 0.95,
                  group_size: int | None = None) -> dict:
    """Summarise the audit in ``out_dir`` and write ``summary.json``, ``samples.jsonl``,
    ``mixed.jsonl`` and (with ``plots``) ``variance.png`` and ``pass_rates.png`` (chapter 4).
    Returns the summary; :class:`AuditError` names a file that cannot be written."""
    out = Path(out_dir)
    audit = load_audit(out)
    summary = summarize(audit, extra_runs=extra_runs, level=level, group_size=group_size)
    rows = per_sample_rows(audit)
    files = {SUMMARY_FILE: json.dumps(summary, indent=2) + "\n",
             SAMPLES_FILE: "".join(json.dumps(_round(r)) + "\n" for r in rows),
             MIXED_FILE: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _mixed_rows(out, audit, rows))}
    for name, text in files.items():
        try:
            (out / name).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise AuditError(f"cannot write {out / name} ({exc.strerror or exc}); the runs are saved in "
                             f"{out / RUNS_FILE}: summarise them later with rlcurate audit --summarize {out}") from None
    if plots:
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from rlcurate.audit.plots import plot_pass_rate_hist, plot_variance
        from rlcurate.book.style import use_style

        use_style(inline=False)
        title = f"{Path(str(audit.config['model'])).name} on {audit.config['task']} ({audit.runs} runs)"
        for name, fig in ((VARIANCE_PLOT, lambda: plot_variance(audit.scores, title=title)),
                          (HISTOGRAM_PLOT, lambda: plot_pass_rate_hist(
                              audit.scores, runs=audit.runs,
                              threshold=float(audit.config.get("success_threshold", 1.0)), title=title))):
            f = fig()
            try:
                f.savefig(out / name, metadata={"Software": None})
            except OSError as exc:
                raise AuditError(f"cannot write {out / name} ({exc.strerror or exc})") from None
            finally:
                plt.close(f)
    return summary


def format_summary(summary: dict) -> str:
    """A short human-readable report of a summary (what ``rlcurate audit`` prints); the verdict comes
    first."""
    c, s, r = summary["categories"], summary["mixed_share"], summary["reliability"]
    n = summary["n_audited"]
    N = summary["config"]["runs"]
    v = summary["verdict"]
    mi = summary.get("mean_interval")
    lines = [
        f"{n} samples x {N} runs ({summary['n_runs']} runs{'' if summary['complete'] else ', INCOMPLETE'})",
        f"  verdict: {v['text']}",
    ]
    if N == 1:
        lines.append(f"  always right {c['always_right']}, always wrong {c['always_wrong']} "
                     "(mixed cannot show with 1 run)")
    else:
        lines.append(f"  always right {c['always_right']}, always wrong {c['always_wrong']}, mixed {c['mixed']} "
                     f"({100 * s['share']:.1f}%, {int(round(100 * s['level']))}% interval "
                     f"{100 * s['low']:.1f}-{100 * s['high']:.1f}%)")
    lines += [
        f"  mean {summary['mean']:.3f}"
        + (f" ({int(round(100 * mi['level']))}% interval {mi['low']:.3f}-{mi['high']:.3f})" if mi else "")
        + f", best-of-{N} {summary['best_of_n']:.3f}, gain {summary['gain']:+.3f}"
        + (f" ({100 * summary['relative_gain']:.0f}% relative)" if summary["relative_gain"] is not None else ""),
        "  pass@k: " + ", ".join(f"k={k_}: {v_:.3f}" for k_, v_ in zip(summary["pass_at_k"]["k"],
                                                                     summary["pass_at_k"]["pass_at_k"])),
    ]
    e, t = summary["reward_errors"], summary["truncation"]
    err = (f"{e['runs']} of {summary['n_runs']} runs ({100 * e['share']:.1f}%) failed and scored 0"
           if e["runs"] else "none")
    lines.append(f"  reward errors: {err}; hit max_new_tokens={t['max_new_tokens']}: {t['runs']} runs "
                 f"({100 * t['share']:.1f}%), {t['failed_runs']} of them failed")
    prior = r.get("prior")
    if prior and prior.get("degenerate"):
        lines.append(f"  fitted prior: degenerate ({prior['degenerate']}); no hidden-signal estimate from it")
    elif prior:
        lines.append(
            f"  fitted prior Beta({prior['a']:.3f}, {prior['b']:.3f}): "
            f"{100 * r['uniform_share_of_truly_mixed']:.1f}% of prompts from it look uniform in {N} runs; "
            f"with {r['extra_runs']} more runs about {r['expected_hidden_mixed']:.1f} uniform samples would turn mixed")
    elif N > 1:
        lines.append("  fitted prior: none (every sample has the same pass rate)")
    a = summary.get("advice")
    if a is not None:
        g = summary["gate"]["by_group_size"]
        parts = {src: [f"G={k_} {v_['share']:.3f}" for k_, v_ in g.items() if v_["source"] == src]
                 for src in ("measured", "fit")}
        lines.append("  mixed groups by group size G: " + "; ".join(
            f"{', '.join(p)} ({'measured' if src == 'measured' else 'Beta-mixture fit'})"
            for src, p in parts.items() if p))
        lines.append(f"  advice: {a['text']}")
    elif not v["data_advice"]:
        lines.append("  advice: none on the data until the verdict's problem is fixed")
    tm = summary.get("timing") or {}
    if tm.get("runs_per_s"):
        lines.append(f"  time: {tm['wall_s']:.1f} s wall over {tm['sessions']} session(s), "
                     f"{tm['runs_per_s']:.1f} runs/s while generating")
    return "\n".join(lines)
