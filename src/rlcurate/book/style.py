"""The book's one plot style. Figures are deterministic: fixed size, dpi and fonts, no dates in the
metadata of saved files, a fixed SVG hash salt."""

from __future__ import annotations

import matplotlib as mpl

COLORS = {
    "blue": "#3366aa",
    "orange": "#dd7733",
    "green": "#449955",
    "red": "#cc3344",
    "purple": "#8855aa",
    "grey": "#777777",
    "teal": "#33aaaa",
    "gold": "#bb9922",
}

_RC = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.8,
    "axes.prop_cycle": mpl.cycler(color=list(COLORS.values())),
    "svg.hashsalt": "rlcurate",
    "svg.fonttype": "path",
    "image.cmap": "viridis",
}


def use_style(inline: bool = True) -> None:
    """Apply the house style. In a notebook, ``inline=True`` also makes the inline backend emit PNG
    without run-dependent metadata."""
    mpl.rcParams.update(_RC)
    if inline:
        try:
            from IPython import get_ipython

            ip = get_ipython()
            if ip is not None:
                from matplotlib_inline.backend_inline import set_matplotlib_formats

                set_matplotlib_formats("png")
                ip.run_line_magic("config", "InlineBackend.print_figure_kwargs = {'bbox_inches': 'tight', 'metadata': {'Software': None}}")
        except Exception:  # outside IPython the rcParams are all that matter
            pass
