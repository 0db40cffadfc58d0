"""A study's figures across models, its summary.json and its index.html (the report's template)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.labels import Titles, label, sweep_titles
from ..core.plotting import examples_axis, legend_outside, pyplot, save_png
from ..core.provenance import stamp
from ..io.checkpoint import atomic_write
from ..reporting.page import Page, Section, figure, table
from .findings import METRIC, axis_name, categorical, closest_learners, closest_table, study_findings, x_order
from .recipe import stage_analyses

SCALAR = {"spd_ilw": ("spd", "ilw", "sime")}
LABELS = {
    "spd": "SPD (lower: closer)",
    "ilw": "ILW (lower: closer)",
    "sime": "SimE (higher: closer)",
    "error_at_2d1": "squared error / d at 2d+1 examples",
    "r2_at_2d1": "R² at 2d+1 examples",
}


def _save(fig, path: Path) -> Path:
    return save_png(fig, path)[0]


def _x_axis(ax, values, x: str) -> None:
    """Ticks at the models' own x values (integers stay integers; categories, such as families, as
    named ticks), labelled with the axis name."""
    ticks = sorted(set(values), key=str) if categorical(values) else sorted(set(values))
    if categorical(values):
        ax.set_xticks(range(len(ticks)), [str(v) for v in ticks])
        ax.set_xlim(-0.5, len(ticks) - 0.5)
    elif all(float(v).is_integer() for v in ticks):
        ax.set_xticks(ticks, [f"{int(v)}" for v in ticks])
    ax.set_xlabel(axis_name(x))


def _with_interval(ax, rows: pd.DataFrame, x: str, name: str, color: str, categories: list | None = None) -> None:
    """value against x with its [ci_low, ci_high] as error bars; on a categorical axis (`categories`,
    the tick order) points only: no line joins two categories."""
    yerr = [rows.value - rows.ci_low, rows.ci_high - rows.value]
    if categories is None:
        ax.errorbar(rows[x], rows.value, yerr=yerr, marker="o", capsize=3, label=name, color=color)
        return
    where = [categories.index(v) for v in rows[x]]
    ax.errorbar(where, rows.value, yerr=yerr, marker="o", ls="none", capsize=3, label=name, color=color)


def _categories(values) -> list | None:
    """The tick order of a categorical x axis (`_x_axis`), None for a numeric one."""
    return sorted(set(values), key=str) if categorical(values) else None


def phase_figure(table: pd.DataFrame, x: str, path: Path, titles: Titles | None = None) -> Path | None:
    """Metric vs x (e.g. depth) per learner: the 'algorithmic phases' of Akyurek et al. 2023, Fig. 3."""
    rows = table[(table.analysis == "spd_ilw") & table.metric.isin(SCALAR["spd_ilw"])]
    if rows.empty:
        return None
    plt = pyplot()
    metrics = [m for m in SCALAR["spd_ilw"] if m in set(rows.metric)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        part = rows[rows.metric == metric]
        for i, (learner, g) in enumerate(part.groupby("learner", sort=True)):
            _with_interval(ax, g.sort_values(x), x, label(learner, titles), f"C{i}", _categories(part[x]))
        _x_axis(ax, part[x], x)
        ax.set_title(LABELS.get(metric, metric))
        if metric in ("spd", "ilw"):
            ax.set_yscale("log")
    legend_outside(axes[0][-1])
    return _save(fig, path)


def icl_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    rows = table[(table.analysis == "evaluate") & table.metric.isin(["error_at_2d1", "r2_at_2d1"])]
    if rows.empty:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for i, (shift, g) in enumerate(rows.groupby("shift", sort=True)):
        _with_interval(ax, g.sort_values(x), x, shift or "in distribution", f"C{i}", _categories(rows[x]))
    metric = rows.metric.iloc[0]
    _x_axis(ax, rows[x], x)
    ax.set_ylabel(LABELS[metric])
    if metric == "error_at_2d1":
        ax.set_yscale("log")
    legend_outside(ax)
    return _save(fig, path)


def curves_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    """R^2 / error against examples, one panel per shift, the model beside direct training."""
    rows = table[(table.analysis == "evaluate") & table.metric.isin(["r2", "error"])]
    if rows.empty or rows.model.nunique() > 8:
        return None
    plt = pyplot()
    shifts = sorted(rows["shift"].unique())
    fig, axes = plt.subplots(1, len(shifts), figsize=(4.2 * len(shifts), 3.6), squeeze=False, sharey=True)
    for ax, shift in zip(axes[0], shifts):
        part = rows[rows["shift"] == shift]
        for i, model in enumerate(x_order(part, x)):
            g = part[part.model == model]
            name = f"{axis_name(x)} {g[x].iloc[0]}"
            for learner, style in (("model", "-"), ("direct", "--")):
                h = g[g.learner == learner].sort_values("n_examples")
                if not h.empty:
                    ax.plot(
                        h.n_examples,
                        h.value,
                        style,
                        color=f"C{i}",
                        label=f"{name} ({'ICL' if learner == 'model' else 'direct'})",
                    )
        ax.set_title(shift or "in distribution")
        examples_axis(ax)
        if part.metric.iloc[0] == "r2":
            ax.set_ylim(-0.5, 1.02)
    axes[0][0].set_ylabel("R²" if rows.metric.iloc[0] == "r2" else "squared error / d")
    legend_outside(axes[0][-1], 8)
    return _save(fig, path)


def best_k_figure(table: pd.DataFrame, x: str, learner: str, path: Path, titles: Titles | None = None) -> Path | None:
    """Best-matching iteration per layer (rows) against the model axis (columns)."""
    rows = table[(table.analysis == "heatmap") & (table.metric == "sime_best_k") & (table.learner == learner)]
    ends = table[(table.metric == "sime_at_grid_end") & (table.learner == learner) & (table.value > 0)]
    title = f"best-matching {label(learner, titles)} iteration by SimE" + (
        " (+: at the grid's end)" if len(ends) else ""
    )
    return _layer_grid(rows, x, title, path, "{:g}", flagged=set(zip(ends.layer, ends[x])))


def spectral_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    """The spectral exponent p per layer (rows) against the model axis (columns), in each layer's
    best family's own bin variable (probe/analysis/spectral.py): 1 the GD class, 2 the Newton class."""
    rows = table[(table.analysis == "spectral") & (table.metric == "spectral_p")]
    return _layer_grid(rows, x, "spectral exponent p (1: GD class, 2: Newton class)", path, "{:.2f}")


# a spectral verdict's reading on the mechanism figure, with its colour
READINGS = {
    "first-order (GD or ridge)": "#4c78a8",
    "Newton class (S-preconditioned)": "#e45756",
    "undecided (ambiguous, mixed, or near convergence)": "#f2b447",
    "not a filter of S": "#9d9d9d",
    "converged": "#a6d96a",
    "no response": "#ffffff",
}


def spectral_reading(verdict: str) -> str:
    """Which of READINGS a spectral verdict (probe/analysis/spectral_verdicts.py) falls in."""
    from ..analysis.spectral_verdicts import verdict_classes
    from .findings import first_order_reading

    if first_order_reading(verdict):
        return "first-order (GD or ridge)"
    if verdict_classes(verdict) in (["precond_gd"], ["newton"]):
        return "Newton class (S-preconditioned)"
    named = {"not a spectral filter": "not a filter of S", "converged": "converged", "no response": "no response"}
    return named.get(verdict, "undecided (ambiguous, mixed, or near convergence)")


def mechanism_figure(table: pd.DataFrame, x: str, path: Path) -> Path | None:
    """Training dynamics of the mechanism in one figure: above, the error / d at 2d+1 (in distribution,
    with its band) and the evidence table's Newton-or-GD answer at each snapshot; below, each layer's
    spectral reading (colour) and exponent p (number) at each snapshot."""
    spectral = table[(table.analysis == "spectral") & (table.metric == "spectral_p")]
    icl = table[(table.analysis == "evaluate") & (table.metric == "error_at_2d1") & (table["shift"] == "")]
    if x != "train_step" or spectral.empty or icl.empty:
        return None
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    steps = sorted(spectral[x].unique())
    layers = sorted(spectral.layer.unique(), reverse=True)
    names = list(READINGS)
    code = np.full((len(layers), len(steps)), np.nan)
    plt = pyplot()
    fig, (top, grid_ax) = plt.subplots(
        2, 1, figsize=(max(6, 0.6 * len(steps) + 3), 3 + 0.32 * len(layers)), height_ratios=[1, 2.2], sharex=True
    )
    icl = icl.set_index(x)
    at = [steps.index(v) for v in icl.index if v in steps]
    icl = icl.loc[[steps[i] for i in at]]
    top.errorbar(at, icl.value, yerr=[icl.value - icl.ci_low, icl.ci_high - icl.value], marker="o", capsize=3)
    top.set_yscale("log")
    top.set_ylabel("error / d at 2d+1")
    answers = table[(table.analysis == "evidence") & (table.learner == "consolidated answer")]
    answers = answers[answers.metric == "newton_vs_gd"].set_index(x).value
    side = {1.0: "newton", -1.0: "gd", 0.0: "undecided"}
    for i, step in enumerate(steps):
        if step in answers.index:
            top.annotate(side.get(float(answers.loc[step]), "?"), (i, 1.02), xycoords=("data", "axes fraction"),
                         ha="center", va="bottom", fontsize=8)  # fmt: skip
    rows = spectral.set_index(["layer", x])
    for (i, layer), (j, step) in ((a, b) for a in enumerate(layers) for b in enumerate(steps)):
        if (layer, step) in rows.index:
            r = rows.loc[(layer, step)]
            code[i, j] = names.index(spectral_reading(str(r.learner)))
            if np.isfinite(r.value):
                grid_ax.text(j, i, f"{r.value:.2f}", ha="center", va="center", fontsize=7)
    grid_ax.imshow(code, aspect="auto", cmap=ListedColormap(list(READINGS.values())), vmin=0, vmax=len(names) - 1)
    grid_ax.set_yticks(range(len(layers)), [str(v) for v in layers])
    grid_ax.set_xticks(range(len(steps)), [str(v) for v in steps], rotation=45, ha="right")
    grid_ax.set_ylabel("layer")
    grid_ax.set_xlabel(axis_name(x))
    handles = [Patch(facecolor=c, edgecolor="#666666", label=n) for n, c in READINGS.items()]
    grid_ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return _save(fig, path)


def _layer_grid(
    rows: pd.DataFrame, x: str, title: str, path: Path, fmt: str, flagged: set | None = None
) -> Path | None:
    """One value per layer (rows) and model (columns) as a labelled colour grid; a (layer, x) cell
    in `flagged` gets a "+" (its best match is at the grid's end)."""
    if rows.empty:
        return None
    plt = pyplot()
    grid = rows.pivot_table(index="layer", columns=x, values="value", aggfunc="first").sort_index(ascending=False)
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * grid.shape[1] + 2), max(3.5, 0.35 * grid.shape[0] + 1.5)))
    im = ax.imshow(grid.values, aspect="auto", cmap="viridis")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
    top = np.nanmax(grid.values) if np.isfinite(grid.values).any() else 0.0
    for (i, j), v in np.ndenumerate(grid.values):
        if np.isfinite(v):
            mark = "+" if (grid.index[i], grid.columns[j]) in (flagged or set()) else ""
            ax.text(
                j,
                i,
                fmt.format(v) + mark,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if v < top / 2 else "black",
            )
    ax.set_xlabel(axis_name(x))
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    return _save(fig, path)


def stabilisation_sentence(name: str, layers: dict, last: Any) -> str:
    """Where each layer's best match settles (`stabilisation`); a layer that settles only at the last
    snapshot is still moving at the end, and is said so."""
    settled = {layer: s for layer, s in layers.items() if s != last}
    moving = [str(layer) for layer, s in layers.items() if s == last]
    parts = []
    if settled:
        parts.append(
            "the best match stabilises (within 1 of its final value) at step "
            + ", ".join(f"{s} (layer {layer})" for layer, s in settled.items())
        )
    if moving:
        parts.append(
            f"still moving at the last snapshot (step {last}): layer{'s' * (len(moving) > 1)} {', '.join(moving)}"
        )
    return f"{name}: " + "; ".join(parts) + "."


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


CAPTIONS = {
    "phases": "{metrics} between the model's own predictions and each compared learner, against {axis} (Akyurek et al. 2023 "
    "Fig. 3; SPD and ILW on a log axis, lower is closer; SimE higher is closer); bars: 90% normal intervals over "
    "prompts.",
    "icl": "{metric} of the model's in-context predictions against {axis}, in distribution and under each "
    "shift; bars: 90% bootstrap band over prompts.",
    "curves": "{metric} against the number of in-context examples for every model (solid: in-context; dashed: the "
    "task's network trained directly on each prompt's examples, as Wu et al. 2024), one panel per distribution.",
    "best_k": "Best-matching {learner} iteration by SimE for every layer (rows) and {axis} (columns).",
    "mechanism": "Above: the error / d at 2d+1 examples in distribution (bars: 90% band over prompts) and the evidence "
    "table's Newton-or-GD answer at each {axis}. Below: each layer's spectral reading (colour) and exponent p (number, "
    "where two bins respond) at each {axis}: is there ever a Newton-class phase, and when does the first-order filter "
    "appear relative to the error's drop?",
    "spectral_p": "Spectral exponent p of every layer (rows) for each {axis} (columns), in the bin variable of the "
    "layer's best-fitting family (probe/analysis/spectral.py): 1 is the GD class's small-eigenvalue limit, 2 the "
    "S-preconditioned class's (Fu et al. 2024's Newton); blank where fewer than two bins respond in [0.05, 0.95] (no response, or converged).",
}


def _caption(name: str, table: pd.DataFrame, x: str, titles: Titles | None = None) -> str:
    evaluate = table[table.analysis == "evaluate"]
    scalar = evaluate[evaluate.metric.str.endswith("_at_2d1")]
    if name.startswith("best_k_"):
        return CAPTIONS["best_k"].format(learner=label(name.removeprefix("best_k_"), titles), axis=axis_name(x))
    metrics = ", ".join(METRIC[m] for m in SCALAR["spd_ilw"] if m in set(table.metric))
    metric = LABELS.get(scalar.metric.iloc[0], "") if len(scalar) else ""
    curve = "R²" if "r2" in set(evaluate.metric) else "Squared error / d"
    return CAPTIONS[name].format(metrics=metrics, axis=axis_name(x), metric=metric if name == "icl" else curve)


def read_table(path: Path) -> pd.DataFrame:
    """A study table from CSV, with empty shift / learner cells as "" (not NaN)."""
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for col in ("shift", "learner"):
        table[col] = table[col].astype("object").fillna("").astype(str)
    return table


def rerender(folder: Path, recipe) -> dict[str, Any]:
    """Figures, index.html and summary.json of a finished study redrawn from its study.csv, without
    recomputing a number: the run's own provenance stays; the page's is recorded under `rendered`."""
    old = json.loads((folder / "summary.json").read_text())
    summary = write_presentation(read_table(folder / "study.csv"), recipe, folder, old.get("timings", {}))
    run = {k: old[k] for k in stamp() if k in old}
    summary = {**summary, "rendered": {k: summary[k] for k in run}, **run}
    text = json.dumps(summary, indent=2, default=str) + "\n"
    atomic_write(folder / "summary.json", lambda p: p.write_text(text))
    return summary


def write_presentation(table: pd.DataFrame, recipe, out: Path, timings: dict[str, float]) -> dict[str, Any]:
    """figures/, summary.json and index.html of a study."""
    x = recipe.x if recipe.x in table.columns else "n_layer"
    titles = study_titles(recipe)
    figs: dict[str, Path] = {}
    for name, fn in (("icl", icl_figure), ("curves", curves_figure)):
        path = fn(table, x, out / "figures" / name)
        if path is not None:
            figs[name] = path
    phases = phase_figure(table, x, out / "figures" / "phases", titles)
    if phases is not None:
        figs = {"phases": phases, **figs}
    learners = sorted(set(table[(table.analysis == "heatmap") & (table.metric == "sime_best_k")].learner))
    for learner in learners:
        path = best_k_figure(table, x, learner, out / "figures" / f"best_k_{learner}", titles)
        if path is not None:
            figs[f"best_k_{learner}"] = path
    spectral = spectral_figure(table, x, out / "figures" / "spectral_p")
    if spectral is not None:
        figs["spectral_p"] = spectral
    mechanism = mechanism_figure(table, x, out / "figures" / "mechanism")
    if mechanism is not None:
        figs["mechanism"] = mechanism
    stable = {lr: stabilisation(table, x, lr) for lr in learners} if x == "train_step" else {}
    icl = table[(table.analysis == "evaluate") & table.metric.isin(["error_at_2d1", "r2_at_2d1"])]
    closest = closest_learners(table)
    summary = {
        "schema_version": 1,
        "study": recipe.name,
        "description": recipe.description,
        "x": x,
        "recipe": recipe.to_dict(),
        "models": x_order(table, x),
        "icl_at_2d1": {f"{r.model}|{r['shift']}": float(r.value) for _, r in icl.iterrows()},
        "closest_learner": closest,
        "evidence": evidence_answers(table),
        "stabilises_at": stable,
        "timings": timings,
        **stamp(),
    }
    text, page = json.dumps(summary, indent=2, default=str) + "\n", study_page(summary, figs, table, x, recipe).render()
    atomic_write(out / "summary.json", lambda p: p.write_text(text))  # each file whole, old or new
    atomic_write(out / "index.html", lambda p: p.write_text(page))
    return summary


def _answer(metric: str, value: float) -> str:
    """An evidence row's side from its question key "<a>_vs_<b>" and value (+1 a, -1 b, 0 neither)."""
    a, b = metric.split("_vs_")
    return a if value > 0 else b if value < 0 else "undecided"


def evidence_answers(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """model -> question -> the evidence table's consolidated answer (study/analyses.py evidence_rows)."""
    rows = table[(table.analysis == "evidence") & (table.learner == "consolidated answer")]
    out: dict[str, dict[str, str]] = {}
    for r in rows.itertuples():
        out.setdefault(str(r.model), {})[r.metric.replace("_vs_", " vs ")] = _answer(r.metric, r.value)
    return out


def evidence_table(table: pd.DataFrame, x: str) -> pd.DataFrame:
    """One row per model and question: every instrument's side and the consolidated answer."""
    rows = table[table.analysis == "evidence"]
    wide = rows.assign(side=[_answer(m, v) for m, v in zip(rows.metric, rows.value)]).pivot_table(
        index=["model", x, "metric"], columns="learner", values="side", aggfunc="first"
    )
    wide = wide.reset_index().rename(columns={"metric": "question"}).sort_values([x, "question"])
    wide["question"] = wide.question.str.replace("_vs_", " vs ")
    return wide


def spectral_table(table: pd.DataFrame, x: str) -> pd.DataFrame:
    """One row per model and layer: the spectral filter's reading (its verdict) and the exponent p in
    the best family's own bin variable with its 90% interval (the spectral stage's study rows, probe/stages/spectral.py)."""
    rows = table[(table.analysis == "spectral") & (table.metric == "spectral_p")]
    out = rows[["model", x, "layer", "learner", "value", "ci_low", "ci_high"]].rename(
        columns={"learner": "reading", "value": "p", "ci_low": "p low", "ci_high": "p high"}
    )
    return out.sort_values([x, "model", "layer"]).reset_index(drop=True)


def study_titles(recipe) -> dict[str, str]:
    """How the study names its compared learners and its report recipe's sweeps (their titles)."""
    return {**sweep_titles(recipe.report_recipe().sweeps), **sweep_titles(recipe.compare)}


def study_page(summary: dict[str, Any], figs: dict[str, Path], frame: pd.DataFrame, x: str, recipe) -> Page:
    """The study's page: headline and findings with intervals, caveats, then figures and tables."""
    titles = study_titles(recipe)
    headline, items, caveats = study_findings(frame, x, summary["closest_learner"], titles)
    last = frame[x].max() if x in frame and len(frame) else None
    for learner, layers in summary["stabilises_at"].items():
        items.append(stabilisation_sentence(label(learner, titles), layers, last))
    fig = {name: figure(path, name.replace("_", " "), _caption(name, frame, x, titles)) for name, path in figs.items()}
    sections = []
    if summary["closest_learner"]:
        sections.append(
            Section(
                "Closest learner per model",
                [fig["phases"], table(closest_table(frame, x, summary["closest_learner"], titles))]
                if "phases" in fig
                else [table(closest_table(frame, x, summary["closest_learner"], titles))],
            )
        )
    if summary.get("evidence"):
        sections.append(Section("Evidence tables: consolidated answers", [table(evidence_table(frame, x))]))
    icl_parts = [fig[k] for k in ("icl", "curves") if k in fig]
    if icl_parts:
        sections.append(Section("In-context performance", icl_parts))
    best = [v for k, v in fig.items() if k.startswith("best_k_")]
    if best:
        sections.append(Section("Best-matching iterations per layer", best))
    spectral = spectral_table(frame, x)
    if len(spectral):
        parts = [fig[k] for k in ("mechanism", "spectral_p") if k in fig]
        sections.append(Section("Spectral filter per layer", [*parts, table(spectral, "{:.2f}")]))
    cols = ["model", x, "analysis", "metric", "learner", "layer", "shift", "value", "ci_low", "ci_high"]
    for name, stage in stage_analyses().items():  # a report stage's own rows (its study_rows hook)
        rows = frame[frame.analysis == name]
        if name != "spectral" and len(rows):
            sections.append(Section(stage.title, [table(rows[[c for c in cols if c != "analysis"]], "{:.4g}")]))
    small = frame[(frame.layer == -1) & (frame.n_examples == -1) | frame.metric.str.endswith("_at_2d1")][cols]
    small = small.assign(
        metric=small.metric.map(lambda m: METRIC.get(m, m)), learner=small.learner.map(lambda n: label(n, titles))
    )
    sections.append(Section("Per-model scalars", [table(small, "{:.4g}")]))
    sections.append(Section("Methods", [_methods(recipe, summary)]))
    return Page(
        title=f"icl-probe study: {summary['study']}",
        subtitle=summary["description"],
        headline=headline,
        findings=items,
        caveats=caveats,
        sections=sections,
        git=str(summary.get("git_commit")),
    )


def _methods(recipe, summary: dict[str, Any]) -> str:
    titles = study_titles(recipe)
    compare = "; ".join(
        f"{label(c.label, titles)}: {c.learner} over {json.dumps(c.grid)} (pick {c.pick})" for c in recipe.compare
    )
    lines = [
        f"Models: {len(summary['models'])}, ordered by {axis_name(summary['x'])}; analyses {', '.join(recipe.analyses)}.",
        f"SPD and ILW (Akyurek et al. 2023, eq. 13-15) and SimE (Fu et al. 2024, eq. 10) on {recipe.prompts} prompts with "
        f"{recipe.queries or '4 d'} fresh queries per prefix; intervals: mean +- 1.645 standard errors over prompts.",
        f"In-context curves on {recipe.evaluate_prompts} prompts, 90% bootstrap bands. Seed {recipe.seed}.",
        *([f"Compared learners: {compare}."] if recipe.compare else []),
        "All rows: study.csv; recipe, versions and git commit: summary.json.",
    ]
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"
