"""How the book prints and draws a suite's comparison (chapter 10, appendix A3): one line per arm of a
:func:`rlcurate.comparison.compare_arms` table, a forest plot of its intervals, per-run metric means, and
the two pictures ``rlcurate compare --plot`` writes (:func:`plot_comparison`)."""

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


def forest(ax, table: Mapping, title: str, color_of: Callable[[str], str], ratio: bool = False) -> None:
    """Each arm's paired difference and interval, top to bottom in the table's order (with ``ratio``: a
    :func:`rlcurate.comparison.ratio_table`'s ratios on a log axis, chapter 11). Filled: Holm's adjusted
    p < 0.05; for an A/A control (:func:`rlcurate.comparison.aa_controls`): its interval excludes no effect."""
    names = list(table)
    for i, arm in enumerate(names):
        r, y = table[arm], len(names) - 1 - i
        no_effect = r.covers_one if ratio else r.covers_zero
        strong = not no_effect if aa_controls([arm]) else r.p_holm < 0.05
        point = r.ratio if ratio else r.mean
        ax.plot([r.low, r.high], [y, y], color=color_of(arm), lw=2.5, alpha=0.9 if strong else 0.4)
        ax.plot(point, y, "o", color=color_of(arm), mfc=color_of(arm) if strong else "white")
    ax.axvline(1.0 if ratio else 0.0, color="black", lw=0.8, ls=":")
    if ratio:  # plain ratios (0.5, 0.7, 1, 1.5) on a log axis, not 5 x 10^-1 and crowded minor labels
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

        ax.set_xscale("log")
        low, high = ax.get_xlim()
        ticks = [t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0) if low <= t <= high]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
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


def plot_comparison(table: Mapping, results, baseline: str, controls, title: str, path, ratio: bool = False,
                    key: str = "eval/accuracy"):
    """The two pictures a reader looks at first (``rlcurate compare --plot``): left, the forest of each arm
    against ``baseline`` (paired differences, or ratios with ``ratio``), the A/A ``controls`` in grey;
    right, each arm's mean curve of ``key`` on the suite's rollout grid with a 95 % t band over its seeds
    (the baseline and the controls drawn first, thin). Writes ``path`` (any format matplotlib knows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    from rlcurate.book.style import COLORS, use_style
    from rlcurate.comparison import grid_curve

    use_style()
    palette = [COLORS[c] for c in ("blue", "orange", "green", "red", "purple", "teal", "gold")]
    palette += [matplotlib.colors.to_hex(c) for c in plt.get_cmap("tab20b").colors[::2]]  # more than 7 arms
    arms = [baseline] + [a for a in table if a != baseline]
    colour = {a: COLORS["grey"] if a in controls else ("black" if a == baseline else palette[i % len(palette)])
              for i, a in enumerate(arms)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.32 * len(table) + 3.2))
    forest(left, table, f"{title}: against {baseline}", colour.get, ratio=ratio)
    left.set_xlabel(f"ratio to {baseline} (rollouts to the target)" if ratio else f"paired difference to {baseline}")
    for arm in arms:
        curves = [grid_curve(r, key) for r in results if r["run"] == arm]
        if not curves:
            continue
        n = min(len(c.grid) for c in curves)
        grid, vals = curves[0].grid[:n], np.array([c.value[:n] for c in curves])
        mean = vals.mean(axis=0)
        half = (stats.t.ppf(0.975, len(curves) - 1) * vals.std(axis=0, ddof=1) / np.sqrt(len(curves))
                if len(curves) > 1 else np.zeros(n))
        thin = arm == baseline or arm in controls
        right.plot(grid, mean, color=colour[arm], lw=1.2 if thin else 1.8, label=arm, zorder=3 if thin else 2)
        right.fill_between(grid, mean - half, mean + half, color=colour[arm], alpha=0.12, lw=0)
    right.set_xlabel("generated rollouts (the suite's grid)")
    right.set_ylabel(key)
    right.set_title(f"{title}: mean curves, 95 % bands over seeds", fontsize=10)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
