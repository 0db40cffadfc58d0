"""Figures for the analyses; each function takes the tidy table it plots and a path stem.

Every figure is written once, as PNG (`<stem>.png`); index.html links to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..analysis.labels import Titles, label
from ..core.plotting import examples_axis, legend_outside, pyplot, save_png


def _thin_ticks(ax, labels: list, axis: str = "y", most: int = 12) -> None:
    """Show at most `most` tick labels (every k-th) so they stay readable in an 800 px window."""
    step = max(1, int(np.ceil(len(labels) / most)))
    ticks = list(range(0, len(labels), step))
    setter = ax.set_yticks if axis == "y" else ax.set_xticks
    setter([t + 0.5 for t in ticks], [str(labels[t]) for t in ticks], rotation=0)


def icl_error(frame: pd.DataFrame, stem: Path, title: str = "") -> list[Path]:
    """Error / d against examples on a linear axis and a log axis (where the model and least
    squares, indistinguishable on the linear one, can be told apart)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, scale in zip(axes, ("linear", "log")):
        ax.plot(frame.n_examples, frame.model, color="C0", lw=2, label="model")
        ax.fill_between(frame.n_examples, frame.model_lo, frame.model_hi, color="C0", alpha=0.25)
        for i, name in enumerate(["least_squares", "knn3", "averaging"]):
            ax.plot(
                frame.n_examples, frame[name], ls="--", color=f"C{i + 1}", label=label(name).replace("knn3", "3-NN")
            )
        examples_axis(ax)
        ax.set(
            ylabel="squared error / d",
            yscale=scale,
            title=f"{title} ({scale} axis)" if title else f"{scale} axis",
        )
        if scale == "linear":
            ax.set_ylim(bottom=0)
        else:
            positive = frame[["model", "least_squares"]].to_numpy()
            ax.set_ylim(
                bottom=max(1e-6, float(np.nanmin(positive[positive > 0])) / 2) if (positive > 0).any() else 1e-6
            )
    legend_outside(axes[1])
    return save_png(fig, stem)


def readout_error(table: pd.DataFrame, stem: Path, n_dims: int) -> list[Path]:
    """Error/d against examples, one line per layer (Fu et al. 2024, Fig. 1a)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    layers = sorted(table.layer.unique())
    cmap = plt.get_cmap("viridis")
    for i, layer in enumerate(layers):
        rows = table[table.layer == layer]
        ax.plot(rows.n_examples, rows.error, color=cmap(i / max(1, len(layers) - 1)), label=f"layer {layer}")
    ax.axvline(n_dims, color="grey", lw=0.8, ls=":")
    examples_axis(ax)
    ax.set(ylabel="squared error / d (retrained read-out)", yscale="log")
    legend_outside(ax, 7, ncol=1 if len(layers) <= 12 else 2)
    return save_png(fig, stem)


def _heatmap_panel(
    ax,
    cells: pd.DataFrame,
    best: pd.DataFrame,
    learner: str,
    metric: str,
    axis: str | None,
    vmin: float,
    vmax: float,
    cbar_ax=None,
    titles: Titles | None = None,
) -> None:
    import seaborn as sns

    rows = cells[(cells.sweep == learner) & (cells.metric == metric)]
    key = axis if axis and axis in rows else "grid_index"
    grid = rows.pivot_table(index=key, columns="layer", values="value")
    if np.all(np.mod(grid.index.to_numpy(dtype=float), 1) == 0):
        grid.index = grid.index.astype(int)  # 3, not 3.0, for iteration and step counts
    sns.heatmap(
        grid,
        ax=ax,
        cmap="magma",
        vmin=vmin,
        vmax=vmax,
        cbar=cbar_ax is not None,
        cbar_ax=cbar_ax,
        cbar_kws={"label": "similarity"} if cbar_ax is not None else None,
        yticklabels=False,
    )
    _thin_ticks(ax, list(grid.index))
    picks = best[(best.sweep == learner) & (best.metric == metric)]
    ylabels = [float(v) for v in grid.index]
    for _, r in picks.iterrows():
        if float(r.k) not in ylabels:
            continue
        x, y = list(grid.columns).index(r.layer), ylabels.index(float(r.k))
        end = bool(r.get("at_grid_end", False))
        ax.add_patch(
            pyplot().Rectangle(
                (x, y), 1, 1, fill=False, edgecolor="red" if end else "cyan", lw=2, ls="--" if end else "-"
            )
        )
        if bool(r.get("degenerate", False)):
            ax.plot([x + 0.15, x + 0.85], [y + 0.15, y + 0.85], color="white", lw=1.5)
            ax.plot([x + 0.15, x + 0.85], [y + 0.85, y + 0.15], color="white", lw=1.5)
    ax.invert_yaxis()
    name = label(learner, titles)
    ax.set(xlabel="layer", ylabel=f"{name}: {key}", title=f"{label(metric)}: layers vs {name}")


def heatmap(
    cells: pd.DataFrame,
    best: pd.DataFrame,
    learner: str,
    metric: str,
    axis: str | None,
    stem: Path,
    titles: Titles | None = None,
) -> list[Path]:
    """One metric: layers on x, the learner's grid on y, similarity as colour (fixed range -1..1 or
    0..1), best match per layer boxed (dashed red: at the grid's end; white cross: not
    distinguishable from predicting 0)."""
    return heatmap_pair(cells, best, learner, axis, stem, metrics=(metric,), titles=titles)


def heatmap_pair(
    cells: pd.DataFrame,
    best: pd.DataFrame,
    learner: str,
    axis: str | None,
    stem: Path,
    metrics: tuple[str, ...] = ("sime", "simw"),
    titles: Titles | None = None,
) -> list[Path]:
    """SimE and SimW of one sweep side by side with one shared colour range and colour bar; the
    sweep is named by its recipe title (`titles`)."""
    plt = pyplot()
    present = [m for m in metrics if ((cells.sweep == learner) & (cells.metric == m)).any()]
    values = cells[(cells.sweep == learner) & cells.metric.isin(present)].value
    vmin = -1.0 if len(values) and values.min() < 0 else 0.0
    n_rows = cells[(cells.sweep == learner) & (cells.metric == present[0])].grid_index.nunique() if present else 1
    n_layers = cells.layer.nunique()
    fig = plt.figure(figsize=(len(present) * (0.5 * n_layers + 2.2) + 0.8, min(9, 0.2 * n_rows + 2.2)))
    spec = fig.add_gridspec(1, len(present) + 1, width_ratios=[1] * len(present) + [0.05], wspace=0.35)
    for i, metric in enumerate(present):
        cbar_ax = fig.add_subplot(spec[0, -1]) if i == len(present) - 1 else None
        _heatmap_panel(fig.add_subplot(spec[0, i]), cells, best, learner, metric, axis, vmin, 1.0, cbar_ax, titles)
    return save_png(fig, stem)


def best_match_trend(
    best: pd.DataFrame, learner: str, metric: str, stem: Path, titles: Titles | None = None
) -> list[Path]:
    """Best-matching k per layer with its interval; a log grid is drawn on a (symmetric) log axis."""
    plt = pyplot()
    rows = best[(best.sweep == learner) & (best.metric == metric)]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.errorbar(rows.layer, rows.k, yerr=[rows.k - rows.k_low, rows.k_high - rows.k], fmt="o-", capsize=3)
    ends = rows[rows.get("at_grid_end", False) == True]
    if len(ends):
        ax.plot(ends.layer, ends.k, "s", mfc="none", mec="red", ms=10, label="at grid end")
        ax.legend(fontsize=7)
    positive = rows.k[rows.k > 0]
    if len(positive) and positive.max() / positive.min() > 50:
        ax.set_yscale("symlog", linthresh=1)
    ax.set(
        xlabel="layer",
        ylabel=f"best-matching {label(learner, titles)} k",
        title=f"{label(metric)} best match, 90% bootstrap",
    )
    return save_png(fig, stem)


def span(table: pd.DataFrame, stem: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    layers = table[table.kind == "layer"]
    cmap = plt.get_cmap("viridis")
    idx = sorted(layers["index"].unique())
    for i, layer in enumerate(idx):
        rows = layers[layers["index"] == layer]
        ax.plot(rows.n_examples, rows.residual, color=cmap(i / max(1, len(idx) - 1)), label=f"layer {layer}")
    null = table.drop_duplicates("n_examples")
    ax.plot(null.n_examples, null.random_null, "k--", label="random vector")
    examples_axis(ax, "in-context examples t")
    ax.set(ylabel="relative residual outside span{x_1..x_t}")
    legend_outside(ax, 7, ncol=1 if len(idx) <= 12 else 2)
    return save_png(fig, stem)


def readout_comparison(tables: dict[str, pd.DataFrame], stem: Path) -> list[Path]:
    """Per-layer readout error of two models side by side (Fu et al. 2024, Fig. 1a vs 1c)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, table in tables.items():
        by = table[table.n_examples >= 1].groupby("layer").error.mean()
        ax.plot(by.index, by.values, "-o", label=name, ms=4)
    ax.set(xlabel="layer", ylabel="error / d (retrained read-out)", yscale="log")
    legend_outside(ax)
    return save_png(fig, stem)


def resolution(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Resolution ceilings (probe/analysis/resolution.py): the largest resolution over a's grid
    against d, one panel per metric, a line per learner pair and condition (label noise dashed)."""
    plt = pyplot()
    metrics = list(dict.fromkeys(table.metric))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    colors = dict(zip(dict.fromkeys(zip(table.a, table.b)), plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, metric in zip(axes[0], metrics):
        rows = table[table.metric == metric]
        for (a, b, kappa, noise), part in rows.groupby(["a", "b", "kappa", "noise"], sort=False):
            ax.plot(
                part.d,
                part.resolution_max,
                marker="o",
                ms=3,
                color=colors[(a, b)],
                ls="--" if noise > 0 else "-",
                alpha=1.0 if kappa == 1 else 0.4,
            )
        ax.set_yscale("log")
        ax.set_xlabel("d")
        ax.set_title(f"{metric}: 1 - best Sim(a_k, b) over k")
    axes[0][0].set_ylabel("largest resolution over a's grid")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, label=f"{label(a)} vs {label(b)}") for (a, b), c in colors.items()]
    handles += [
        Line2D([], [], color="k", ls="-", label="noise 0"),
        Line2D([], [], color="k", ls="--", label="noise > 0"),
        Line2D([], [], color="k", alpha=0.4, label="kappa > 1 (faded)"),
    ]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return save_png(fig, stem)


SPECTRAL_FLOOR = 1e-4  # responses below this (or negative) are drawn at it on the log axis


def _decade_ticks(ax, decades: float) -> None:
    """Log-axis labels at whole decades (at 1, 2 and 5 of each where the data span under two),
    the other ticks unlabelled: matplotlib's own labels at 2x, 3x, ... of a narrow range
    overlapped into one unreadable string."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 2 else (1.0,), numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=7)


def spectral_curves(curves: pd.DataFrame, variable: str, stem: Path) -> list[Path]:
    """Each layer's response r against the eigenvalue variable on log-log axes, 90% band, with each
    filter class's best member (times its gain) dashed (probe/analysis/spectral.py)."""
    from ..analysis.spectral_bins import VARIABLES
    from ..analysis.spectral_references import CLASSES

    plt = pyplot()
    rows = curves[curves.variable == variable]
    layers = list(dict.fromkeys(rows[rows.kind == "layer"].predictor))
    cols = min(4, len(layers))
    nrows = -(-len(layers) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.0 * cols, 2.4 * nrows), squeeze=False, sharex=True, sharey=True)
    for ax, layer in zip(axes.flat, layers):
        own = rows[(rows.predictor == layer) & (rows.kind == "layer")].sort_values("u")
        ax.plot(own.u, own.r.clip(lower=SPECTRAL_FLOOR), "-o", color="k", ms=3, label="layer")
        ax.fill_between(
            own.u, own.ci_low.clip(lower=SPECTRAL_FLOOR), own.ci_high.clip(lower=SPECTRAL_FLOOR), color="k", alpha=0.15
        )
        fits = rows[(rows.predictor == layer) & (rows.kind == "fit")]
        for klass, fit in fits.groupby("class", sort=False):
            fit = fit.sort_values("u")
            color = f"C{list(CLASSES).index(klass)}"
            ax.plot(fit.u, fit.r.clip(lower=SPECTRAL_FLOOR), "--", lw=1, color=color, label=f"{klass} class")
        ax.set(xscale="log", yscale="log", title=f"layer {layer}")
        ax.title.set_fontsize(8)
    for ax in axes.flat[len(layers) :]:
        ax.axis("off")
    u = rows.u[rows.u > 0]
    decades = float(np.log10(u.max() / u.min())) if len(u) else 0.0
    for i, ax in enumerate(axes.flat[: len(layers)]):
        _decade_ticks(ax, decades)
        if i + cols >= len(layers):  # the lowest panel of its column carries the axis's name and labels
            ax.tick_params(labelbottom=True)
            ax.set_xlabel(VARIABLES[variable], fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("response r", fontsize=8)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return save_png(fig, stem)


def spectral_exponents(layers: pd.DataFrame, stem: Path) -> list[Path]:
    """The local exponent p per layer in each bin variable with its 90% interval; 1 is the GD
    class's small-eigenvalue limit, 2 Fu et al.'s Newton's (probe/analysis/spectral.py)."""
    from ..analysis.spectral_bins import VARIABLES

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for i, (variable, rows) in enumerate(layers.groupby("variable", sort=False)):
        x = rows.predictor.astype(int) + (i - 0.5) * 0.12
        ax.errorbar(
            x,
            rows.p,
            yerr=[(rows.p - rows.p_low).clip(lower=0), (rows.p_high - rows.p).clip(lower=0)],
            fmt="o",
            ms=3,
            capsize=2,
            label=VARIABLES[variable],
        )
    for level, text in ((1.0, "GD class"), (2.0, "Newton class")):
        ax.axhline(level, color="grey", lw=0.8, ls=":")
        ax.text(0, level, f" {text}", fontsize=7, va="bottom", color="grey")
    ax.set(xlabel="layer", ylabel="local exponent p")
    legend_outside(ax, 7)
    return save_png(fig, stem)
