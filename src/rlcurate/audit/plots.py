"""Figures of a variance audit (chapter 4, *The variance audit*).

* :func:`plot_variance`: the *variance plot*, one column per sample sorted by its mean score: the
  mean as a dot with a +-1 standard deviation bar, the best of the N runs as a red cross. Samples
  whose bar has length zero are uniform (all runs agree) and give GRPO no signal.
* :func:`plot_pass_rate_hist`: how many samples succeeded on 0, 1, ..., N of their runs.
* :func:`plot_zero_variance`: P(all n runs agree | p) = p^n + (1-p)^n against p, for several n.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlcurate.book.style import COLORS
from rlcurate.stats import sample_metrics, zero_variance_prob

__all__ = ["plot_variance", "plot_pass_rate_hist", "plot_zero_variance"]


def _axes(ax, figsize):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def plot_variance(scores, ax=None, title: str | None = None, sort: bool = True, figsize=(8.0, 3.6)):
    """The variance plot of a score matrix (chapter 4); returns the figure.

    Samples are sorted by mean score (ties by best score), so the always-wrong samples form a flat
    run at 0 on the left, the always-right ones a run at 1 on the right, and the mixed ones the
    slope in between, where the best-of-N crosses sit above the means. The +-1 std bars are cut at
    the worst and best run, so that they never leave the range of scores the sample really got.
    """
    m = sample_metrics(scores)
    order = np.lexsort((m["best"], m["mean"])) if sort else np.arange(len(m["mean"]))
    x = np.arange(len(order))
    mean, std = m["mean"][order], m["std"][order]
    lower = np.minimum(std, mean - m["worst"][order])
    upper = np.minimum(std, m["best"][order] - mean)
    fig, ax = _axes(ax, figsize)
    small = len(order) > 150
    ax.errorbar(x, mean, yerr=np.vstack([lower, upper]), fmt="o", ms=1.5 if small else 3,
                color=COLORS["blue"], ecolor=COLORS["blue"], elinewidth=0.6 if small else 1.0,
                label="mean ± std of the runs")
    ax.scatter(x, m["best"][order], marker="x", s=8 if small else 25, lw=0.8, color=COLORS["red"],
               label="best run", zorder=3)
    top = max(1.0, float(m["best"].max()))
    ax.set(xlabel="sample (sorted by mean score)", ylabel="score", ylim=(-0.05 * top, 1.05 * top))
    ax.set_xlim(-1, len(order))
    if title:
        ax.set_title(title)
    ax.legend(loc="center left", frameon=True, framealpha=0.9, edgecolor="none")
    return fig


def plot_pass_rate_hist(scores, runs: int | None = None, threshold: float = 1.0, ax=None, label: str | None = None,
                        color=None, title: str | None = None, offset: float = 0.0, width: float = 0.8,
                        figsize=(6.4, 3.4)):
    """Bar chart of the number of samples with 0, 1, ..., N successful runs (chapter 4).

    ``runs`` defaults to the longest row; rows with fewer runs are left out. The two outer bars are
    the zero-variance samples; ``offset`` and ``width`` let several audits share one axis.
    """
    rows = [np.asarray(r, dtype=float) for r in scores]
    N = int(runs or max(r.size for r in rows))
    k = np.array([int((r >= threshold).sum()) for r in rows if r.size == N])
    counts = np.bincount(k, minlength=N + 1)
    fig, ax = _axes(ax, figsize)
    bars = ax.bar(np.arange(N + 1) + offset, counts, width=width, color=color or COLORS["blue"], label=label)
    if color is None:
        for j in (0, N):
            bars[j].set_color(COLORS["grey"])
    ax.set(xlabel=f"successful runs out of {N}", ylabel="samples")
    ax.set_xticks(np.arange(N + 1))
    if title:
        ax.set_title(title)
    return fig


def plot_zero_variance(ns: Sequence[int] = (2, 3, 5, 8, 16), ax=None, figsize=(6.4, 3.6)):
    """P(all n runs agree | p) = p^n + (1-p)^n against the pass rate p, one curve per n (chapter 4)."""
    p = np.linspace(0, 1, 401)
    fig, ax = _axes(ax, figsize)
    for n, c in zip(ns, COLORS.values()):
        ax.plot(p, zero_variance_prob(p, n), color=c, label=f"n = {n}")
    ax.set(xlabel="pass rate p", ylabel="P(zero variance in n runs)", ylim=(0, 1.02))
    ax.legend(loc="upper center", ncol=len(ns))
    return fig
