"""How the book prints and draws a suite's comparison (chapter 10, appendix A3): one line per arm of a
:func:`rlcurate.comparison.compare_arms` table, a forest plot of its intervals, and per-run metric means."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from rlcurate.comparison import aa_controls

PAIRED_HEADER = (f"{'':<20}{'seeds':>6}{'mean':>8}{'diff':>9}{'95% interval':>19}{'p (t)':>8}{'p (sign)':>9}"
                 f"{'p (Holm)':>9}")


def paired_row(arm: str, r, values: Mapping[str, Mapping[int, float]], width: int = 20) -> str:
    """One line under :data:`PAIRED_HEADER`: seeds, the arm's mean, its paired difference to the
    baseline with the 95% t interval, the t and sign-flip p-values and Holm's adjusted p."""
    return (f"{arm:<{width}}{r.n:>6}{np.mean(list(values[arm].values())):>8.3f}{r.mean:>+9.3f}"
            f"{f'[{r.low:+.3f}, {r.high:+.3f}]':>19}{r.p_t:>8.3f}{r.p_sign_flip:>9.3f}{r.p_holm:>9.3f}")


def forest(ax, table: Mapping, title: str, color_of: Callable[[str], str]) -> None:
    """Each arm's paired difference and interval, top to bottom in the table's order. Filled: Holm's
    adjusted p < 0.05; for an A/A control (:func:`rlcurate.comparison.aa_controls`): its interval excludes zero."""
    names = list(table)
    for i, arm in enumerate(names):
        r, y = table[arm], len(names) - 1 - i
        strong = not r.covers_zero if aa_controls([arm]) else r.p_holm < 0.05
        ax.plot([r.low, r.high], [y, y], color=color_of(arm), lw=2.5, alpha=0.9 if strong else 0.4)
        ax.plot(r.mean, y, "o", color=color_of(arm), mfc=color_of(arm) if strong else "white")
    ax.axvline(0.0, color="black", lw=0.8, ls=":")
    ax.set_yticks(range(len(names)), names[::-1], fontsize=8)
    ax.set_title(title, fontsize=10)


def mean_metric(runs, key: str, after_rollouts: float = 0) -> float:
    """A per-step metric (``key`` of the runs' metrics records) averaged over each run's steps, then over
    the runs that logged it; NaN when none did (the tables of how each arm spent its budget). With
    ``after_rollouts`` only the steps that ended after that many generated rollouts (``total/rollouts``)."""
    def steps(r):
        return [m[key] for m in r["metrics"] if key in m and m.get("total/rollouts", 0) > after_rollouts]

    vals = [np.mean(steps(r)) for r in runs if steps(r)]
    return float(np.mean(vals)) if vals else float("nan")
