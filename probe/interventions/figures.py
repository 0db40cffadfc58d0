"""Figures for the causal checks (this package): ablation, patching, iteration consistency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..analysis.labels import Titles, label
from ..core.plotting import pyplot, save_png
from .ablate import increase_matrix


def ablation(frame: pd.DataFrame, stem: Path) -> list[Path]:
    """Components x examples heatmap of the error increase over the unablated model."""

    plt = pyplot()
    matrix = increase_matrix(frame)
    fig, ax = plt.subplots(figsize=(6.5, max(2.5, 0.16 * len(matrix) + 1.2)))
    values = matrix.to_numpy()
    bound = float(np.nanmax(np.abs(values))) if values.size else 1.0
    im = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
    ax.set_yticks(range(len(matrix)), matrix.index, fontsize=6 if len(matrix) > 40 else 8)
    ax.set_xticks(range(len(matrix.columns)), matrix.columns, fontsize=8)
    ax.set(xlabel="in-context examples", title="ablation: increase in squared error / d")
    fig.colorbar(im, ax=ax, fraction=0.04)
    return save_png(fig, stem)


def patching(frame: pd.DataFrame, site: str, stem: Path) -> list[Path]:
    """Layer x token heatmap of the fraction of the clean prediction restored (one site)."""
    plt = pyplot()
    view = frame[frame.site == site]
    matrix = view.pivot_table(index="layer", columns="position", values="restored")
    tokens = view.drop_duplicates("position").set_index("position").token.reindex(matrix.columns)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.22 * matrix.shape[1] + 2), 0.3 * matrix.shape[0] + 1.6))
    im = ax.imshow(
        matrix.to_numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower", interpolation="nearest"
    )
    ax.set_xticks(range(matrix.shape[1]), tokens.tolist(), rotation=90, fontsize=7)
    ax.set_yticks(range(matrix.shape[0]), matrix.index, fontsize=8)
    what = "boundary (0 = embeddings)" if site == "resid" else "block"
    ax.set(xlabel="patched token", ylabel=what, title=f"patching {site}: fraction of the clean prediction restored")
    fig.colorbar(im, ax=ax, fraction=0.04)
    return save_png(fig, stem)


def iteration_consistency(frames: dict[str, pd.DataFrame], stem: Path, titles: Titles | None = None) -> list[Path]:
    """Observed vs expected fraction per boundary, one panel per learner map."""
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(frames)), figsize=(4.2 * max(1, len(frames)), 3.4), squeeze=False)
    for ax, (sweep, frame) in zip(axes[0], frames.items()):
        ax.errorbar(
            frame.boundary,
            frame.observed,
            yerr=[frame.observed - frame.observed_lo, frame.observed_hi - frame.observed],
            fmt="o-",
            color="C0",
            label="observed (model)",
            capsize=2,
        )
        name = label(sweep, titles)
        ax.plot(frame.boundary, frame.expected, "s--", color="C1", label=f"expected from the {name} map")
        ax.set(xlabel="patched boundary", ylabel="fraction of the source's change", title=name, ylim=(-0.1, 1.15))
        ax.legend(fontsize=7)
    return save_png(fig, stem)
