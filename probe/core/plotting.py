"""What every figure shares: matplotlib without a display, byte-deterministic PNGs, legends
outside the axes and integer example axes (probe/reporting/figures.py and the analyses that
declare their own figures, probe/core/stages.py)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10})
    return plt


def save_png(fig, stem: Path) -> list[Path]:
    """The PNG, byte-deterministic for the same figure (no dates or software versions in the file)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png")]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return paths


def legend_outside(ax, fontsize: int = 8, **kw) -> None:
    """The legend right of the axes, so it never covers data."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


def examples_axis(ax, text: str = "in-context examples") -> None:
    """An axis of example counts: integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(text)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
