"""Figures for the analyses; each function takes the tidy table it plots and a path stem.

Every figure is written as PNG and SVG (`<stem>.png`, `<stem>.svg`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    _plt().close(fig)
    return paths


def icl_error(frame: pd.DataFrame, stem: Path, title: str = "") -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(frame.n_examples, frame.model, color="C0", lw=2, label="model")
    ax.fill_between(frame.n_examples, frame.model_lo, frame.model_hi, color="C0", alpha=0.25)
    for i, name in enumerate(["least_squares", "knn3", "averaging"]):
        ax.plot(frame.n_examples, frame[name], ls="--", color=f"C{i + 1}", label=name.replace("_", " "))
    ax.set(xlabel="in-context examples", ylabel="squared error / d", title=title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return _save(fig, stem)


def readout_error(table: pd.DataFrame, stem: Path, n_dims: int) -> list[Path]:
    """Error/d against examples, one line per layer (seed 003 Fig. 1a)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    layers = sorted(table.layer.unique())
    cmap = plt.get_cmap("viridis")
    for i, layer in enumerate(layers):
        rows = table[table.layer == layer]
        ax.plot(rows.n_examples, rows.error, color=cmap(i / max(1, len(layers) - 1)), label=f"layer {layer}")
    ax.axvline(n_dims, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="in-context examples", ylabel="squared error / d (retrained read-out)", yscale="log")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, stem)


def heatmap(cells: pd.DataFrame, best: pd.DataFrame, learner: str, metric: str, axis: str | None, stem: Path) -> list[Path]:
    """Layers on x, the learner's grid on y, similarity as colour, best match per layer boxed."""
    import seaborn as sns

    plt = _plt()
    rows = cells[(cells.b == learner) & (cells.metric == metric)]
    key = axis if axis and axis in rows else "b_index"
    grid = rows.pivot_table(index=key, columns="layer", values="value")
    if np.all(np.mod(grid.index.to_numpy(dtype=float), 1) == 0):
        grid.index = grid.index.astype(int)  # 3, not 3.0, for iteration and step counts
    fig, ax = plt.subplots(figsize=(0.55 * grid.shape[1] + 2.5, 0.22 * grid.shape[0] + 1.8))
    sns.heatmap(grid, ax=ax, cmap="magma", cbar_kws={"label": metric.upper()}, vmin=max(-1, np.nanmin(grid.values)), vmax=1)
    picks = best[(best.learner == learner) & (best.metric == metric)]
    ylabels = [float(v) for v in grid.index]
    for _, r in picks.iterrows():
        if float(r.k) in ylabels:
            ax.add_patch(plt.Rectangle((list(grid.columns).index(r.layer), ylabels.index(float(r.k))), 1, 1, fill=False,
                                       edgecolor="cyan", lw=2))
    ax.invert_yaxis()
    ax.set(xlabel="layer", ylabel=f"{learner} {key}", title=f"{metric.upper()}: layers vs {learner}")
    return _save(fig, stem)


def best_match_trend(best: pd.DataFrame, learner: str, metric: str, stem: Path) -> list[Path]:
    plt = _plt()
    rows = best[(best.learner == learner) & (best.metric == metric)]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.errorbar(rows.layer, rows.k, yerr=[rows.k - rows.k_low, rows.k_high - rows.k], fmt="o-", capsize=3)
    ax.set(xlabel="layer", ylabel=f"best-matching {learner} k", title=f"{metric.upper()} best match, 90% bootstrap")
    return _save(fig, stem)


def span(table: pd.DataFrame, stem: Path) -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    layers = table[table.kind == "layer"]
    cmap = plt.get_cmap("viridis")
    idx = sorted(layers["index"].unique())
    for i, layer in enumerate(idx):
        rows = layers[layers["index"] == layer]
        ax.plot(rows.n_examples, rows.residual, color=cmap(i / max(1, len(idx) - 1)), label=f"layer {layer}")
    null = table.drop_duplicates("n_examples")
    ax.plot(null.n_examples, null.random_null, "k--", label="random vector")
    ax.set(xlabel="in-context examples t", ylabel="relative residual outside span{x_1..x_t}")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, stem)


def probes(table: pd.DataFrame, stem: Path) -> list[Path]:
    """R^2 by layer for each target and probe kind, beside the controls."""
    plt = _plt()
    combos = sorted(table.groupby(["target", "kind"]).groups)
    fig, axes = plt.subplots(1, len(combos), figsize=(3.2 * len(combos), 3.0), sharey=True, squeeze=False)
    for ax, (target, kind) in zip(axes[0], combos):
        rows = table[(table.target == target) & (table.kind == kind)]
        for control, style in (("none", "-o"), ("random_model", "--"), ("shuffled", ":")):
            r = rows[rows.control == control].groupby("layer").r2.mean()
            if len(r):
                ax.plot(r.index, r.values, style, label={"none": "model", "random_model": "random-weights model",
                                                         "shuffled": "shuffled targets"}[control])
        ax.set(title=f"{target} ({kind})", xlabel="layer")
    axes[0][0].set_ylabel("held-out R^2 (mean over prefixes)")
    axes[0][0].legend(fontsize=7)
    return _save(fig, stem)


def forgetting(table: pd.DataFrame, stem: Path) -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, rows in table.groupby("predictor"):
        ax.plot(rows.gap, rows.error.clip(lower=1e-12), "-o" if name == "model" else "--", label=name, ms=3)
    ax.set(xlabel="time-stamp gap n - i", ylabel="squared error / d on reused x_i", yscale="log")
    ax.legend(fontsize=7)
    return _save(fig, stem)


def readout_comparison(tables: dict[str, pd.DataFrame], stem: Path) -> list[Path]:
    """Per-layer readout error of two models side by side (seed 003 Fig. 1a vs 1c)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, table in tables.items():
        by = table[table.n_examples >= 1].groupby("layer").error.mean()
        ax.plot(by.index, by.values, "-o", label=name, ms=4)
    ax.set(xlabel="layer", ylabel="error / d (retrained read-out)", yscale="log")
    ax.legend(fontsize=8)
    return _save(fig, stem)
