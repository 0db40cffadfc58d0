"""A study's figures across models, its summary.json and a self-contained index.html."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..provenance import stamp

SCALAR = {"spd_ilw": ("spd", "ilw", "sime")}
LABELS = {
    "spd": "SPD (lower: closer)",
    "ilw": "ILW (lower: closer)",
    "sime": "SimE (higher: closer)",
    "error_at_2d1": "error / d at 2d+1 examples",
    "r2_at_2d1": "R² at 2d+1 examples",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11})
    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"), dpi=110, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.with_suffix(".png")


def _x_order(table: pd.DataFrame, x: str) -> list[str]:
    order = table[["model", x]].drop_duplicates().sort_values([x, "model"])
    return list(order.model)


def phase_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    """Metric vs x (e.g. depth) per learner: the 'algorithmic phases' of seed 002 Fig. 3."""
    rows = table[(table.analysis == "spd_ilw") & table.metric.isin(SCALAR["spd_ilw"])]
    if rows.empty:
        return None
    plt = _plt()
    metrics = [m for m in SCALAR["spd_ilw"] if m in set(rows.metric)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        part = rows[rows.metric == metric]
        for i, (learner, g) in enumerate(part.groupby("learner", sort=True)):
            g = g.sort_values(x)
            ax.errorbar(
                g[x],
                g.value,
                yerr=[g.value - g.ci_low, g.ci_high - g.value],
                marker="o",
                capsize=3,
                label=learner,
                color=f"C{i}",
            )
        ax.set_xlabel(x.replace("_", " "))
        ax.set_title(LABELS.get(metric, metric))
        if metric in ("spd", "ilw"):
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=9)
    return _save(fig, path)


def icl_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    rows = table[(table.analysis == "evaluate") & table.metric.isin(["error_at_2d1", "r2_at_2d1"])]
    if rows.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for i, (shift, g) in enumerate(rows.groupby("shift", sort=True)):
        g = g.sort_values(x)
        ax.errorbar(
            g[x],
            g.value,
            yerr=[g.value - g.ci_low, g.ci_high - g.value],
            marker="o",
            capsize=3,
            label=shift or "in distribution",
            color=f"C{i}",
        )
    metric = rows.metric.iloc[0]
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(LABELS[metric])
    if metric == "error_at_2d1":
        ax.set_yscale("log")
    ax.legend(fontsize=9)
    return _save(fig, path)


def curves_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    """R^2 / error against examples, one panel per shift, the model beside direct training."""
    rows = table[(table.analysis == "evaluate") & table.metric.isin(["r2", "error"])]
    if rows.empty or rows.model.nunique() > 8:
        return None
    plt = _plt()
    shifts = sorted(rows["shift"].unique())
    fig, axes = plt.subplots(1, len(shifts), figsize=(4.2 * len(shifts), 3.6), squeeze=False, sharey=True)
    for ax, shift in zip(axes[0], shifts):
        part = rows[rows["shift"] == shift]
        for i, model in enumerate(_x_order(part, x)):
            g = part[part.model == model]
            label = f"{x}={g[x].iloc[0]}"
            for learner, style in (("model", "-"), ("direct", "--")):
                h = g[g.learner == learner].sort_values("n_examples")
                if not h.empty:
                    ax.plot(
                        h.n_examples,
                        h.value,
                        style,
                        color=f"C{i}",
                        label=f"{label} ({'ICL' if learner == 'model' else 'direct'})",
                    )
        ax.set_title(shift or "in distribution")
        ax.set_xlabel("in-context examples")
        if part.metric.iloc[0] == "r2":
            ax.set_ylim(-0.5, 1.02)
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def best_k_figure(table: pd.DataFrame, x: str, learner: str, path: Path) -> Path | None:
    """Best-matching iteration per layer (rows) against the model axis (columns)."""
    rows = table[(table.analysis == "heatmap") & (table.metric == "sime_best_k") & (table.learner == learner)]
    if rows.empty:
        return None
    plt = _plt()
    grid = rows.pivot_table(index="layer", columns=x, values="value", aggfunc="first").sort_index(ascending=False)
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * grid.shape[1] + 2), max(3.5, 0.35 * grid.shape[0] + 1.5)))
    im = ax.imshow(grid.values, aspect="auto", cmap="viridis")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
    for (i, j), v in np.ndenumerate(grid.values):
        if np.isfinite(v):
            ax.text(
                j,
                i,
                f"{v:g}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if v < np.nanmax(grid.values) / 2 else "black",
            )
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("layer")
    ax.set_title(f"best-matching {learner} iteration by SimE")
    fig.colorbar(im, ax=ax)
    return _save(fig, path)


def stabilisation(table: pd.DataFrame, x: str, learner: str, tol: float = 1.0) -> dict[int, Any]:
    """Per layer: the first x (training step) from which the best match stays within `tol` of
    its final value at every later snapshot."""
    rows = table[(table.analysis == "heatmap") & (table.metric == "sime_best_k") & (table.learner == learner)]
    out = {}
    for layer, g in rows.groupby("layer"):
        g = g.sort_values(x)
        values, xs = g.value.to_numpy(), g[x].to_numpy()
        final = values[-1]
        ok = np.abs(values - final) <= tol
        first = len(ok)
        while first > 0 and ok[first - 1]:
            first -= 1
        out[int(layer)] = int(xs[first]) if first < len(xs) else None
    return out


def verdicts(table: pd.DataFrame) -> dict[str, Any]:
    """Per model: the compared learner with the lowest SPD, and with the lowest ILW."""
    rows = table[(table.analysis == "spd_ilw")]
    out = {}
    for model, g in rows.groupby("model"):
        entry = {}
        for metric, better in (("spd", "min"), ("ilw", "min"), ("sime", "max")):
            part = g[g.metric == metric].sort_values("value", ascending=better == "min")
            if not part.empty:
                entry[metric] = {
                    "closest": part.learner.iloc[0],
                    "value": float(part.value.iloc[0]),
                    "runner_up": part.learner.iloc[1] if len(part) > 1 else None,
                }
        out[model] = entry
    return out


def write_presentation(table: pd.DataFrame, recipe, out: Path, timings: dict[str, float]) -> dict[str, Any]:

    x = recipe.x if recipe.x in table.columns else "n_layer"
    figs: dict[str, Path] = {}
    for name, fn in (("phases", phase_figure), ("icl", icl_figure), ("curves", curves_figure)):
        path = fn(table, x, out / "figures" / name)
        if path is not None:
            figs[name] = path
    learners = sorted(set(table[(table.analysis == "heatmap") & (table.metric == "sime_best_k")].learner))
    for learner in learners:
        path = best_k_figure(table, x, learner, out / "figures" / f"best_k_{learner}")
        if path is not None:
            figs[f"best_k_{learner}"] = path
    stable = {lr: stabilisation(table, x, lr) for lr in learners} if x == "train_step" else {}
    icl = table[(table.analysis == "evaluate") & table.metric.isin(["error_at_2d1", "r2_at_2d1"])]
    summary = {
        "schema_version": 1,
        "study": recipe.name,
        "description": recipe.description,
        "x": x,
        "recipe": recipe.to_dict(),
        "models": sorted(table.model.unique(), key=lambda m: (table[table.model == m][x].iloc[0], m)),
        "icl_at_2d1": {f"{r.model}|{r['shift']}": float(r.value) for _, r in icl.iterrows()},
        "closest_learner": verdicts(table),
        "stabilises_at": stable,
        "timings": timings,
        **stamp(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "index.html").write_text(render(summary, figs, table, x))
    return summary


def _img(path: Path, alt: str) -> str:
    src = html.escape(f"{path.parent.name}/{path.name}")  # figures/<name>.png beside index.html
    return f'<figure><img src="{src}" alt="{html.escape(alt)}"><figcaption>{html.escape(alt)}</figcaption></figure>'


def render(summary: dict[str, Any], figs: dict[str, Path], table: pd.DataFrame, x: str) -> str:
    esc = html.escape
    parts = [f"<h1>Study: {esc(summary['study'])}</h1><p>{esc(summary['description'])}</p>", "<h2>Findings</h2><ul>"]
    for model, entry in summary["closest_learner"].items():
        if entry:
            text = "; ".join(
                f"{m.upper()}: closest {v['closest']} ({v['value']:.4g}), then {v['runner_up']}"
                for m, v in entry.items()
            )
            parts.append(f"<li><b>{esc(model)}</b>: {esc(text)}</li>")
    for key, value in summary["icl_at_2d1"].items():
        model, shift = key.split("|")
        parts.append(f"<li>{esc(model)} {esc(shift or 'in distribution')}: at 2d+1 examples {value:.4g}</li>")
    for learner, layers in summary["stabilises_at"].items():
        parts.append(
            f"<li>{esc(learner)}: best match stabilises (within 1 of its final value) at step "
            + ", ".join(f"layer {l}: {s}" for l, s in layers.items())
            + "</li>"
        )
    parts.append("</ul><h2>Figures</h2>")
    parts += [_img(p, name.replace("_", " ")) for name, p in figs.items()]
    cols = ["model", x, "analysis", "metric", "learner", "layer", "shift", "value"]
    small = table[(table.layer == -1) & (table.n_examples == -1) | table.metric.str.endswith("_at_2d1")][cols]
    parts.append(
        "<h2>Per-model scalars</h2>" + small.to_html(index=False, float_format=lambda v: f"{v:.4g}", escape=True)
    )
    parts.append("<p>All rows: <code>study.csv</code>; provenance: <code>summary.json</code>.</p>")
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}img{max-width:100%}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(summary['study'])}</title>"
        f"<style>{style}</style></head><body>" + "\n".join(parts) + "</body></html>\n"
    )
