"""The layer analyses, the report's spine (seed 003 §4): per-layer read-out retraining, each layer's
similarity (SimE, SimW) to every swept learner over its grid with the best match and its trend,
Table 1 (the final layer against each learner) with its nulls and paired verdicts, the span test and
each layer's spectral filter (probe/analysis/spectral.py). It reads the built-in sections [readout],
[similarity], [[sweeps]] and [spectral] and runs in every report; its blocks (readout, best_match,
trend, table1, nulls, span, spectral) are top-level keys of summary.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.labels import Titles, label, sweep_titles
from ..analysis.matching import family_of, trend_words
from ..analysis.pipeline import LayerSettings, analyse_layers
from ..analysis.readout import LayerReadouts
from ..analysis.spectral import CLASSES, reference_families
from ..core import budget
from ..core.errors import ConfigError
from ..core.settings import query_count
from ..core.stages import OMIT, AnalysisStage, StageTables, register_stage
from ..io.outputs import safe_name
from ..models.constructions import CONSTRUCTIONS
from ..models.sizes import shape_of
from . import figures
from .columns import column, columns, int_if_integral, plain
from .page import table as html_table

SECTIONS = ("readout", "similarity", "sweeps", "spectral")  # the recipe sections it reads besides [prompts]


@dataclass
class Readout:
    layer: list[int]
    error: list[float]
    error_at_2d1: list[float] | None
    method: str
    alpha: list[float] | None
    error_definition: str = "mean over n_examples >= 1 of squared error / d on held-out prompts"


@dataclass
class Match:
    """One learner's best match per layer under one metric (seed 003 eq. 9-12), 90% intervals."""

    layer: list[int]
    k: list
    k_low: list
    k_high: list
    similarity: list[float]
    ci_low: list[float]
    ci_high: list[float]
    at_grid_end: list[bool]
    zero_similarity: list[float] | None = field(default=None, metadata=OMIT)
    degenerate: list[bool] | None = field(default=None, metadata=OMIT)


@dataclass
class TrendFit:
    """Linear and exponential fits of the best k against layer (seed 003 Fig. 3)."""

    linear_r2: float | None
    exponential_r2: float | None
    slope: float | None
    growth: float | None
    verdict: str
    layers: list[int]
    # 90% intervals over prompt resamples, and the share of resamples on which the shape holds
    slope_low: float | None = field(default=None, metadata=OMIT)
    slope_high: float | None = field(default=None, metadata=OMIT)
    growth_low: float | None = field(default=None, metadata=OMIT)
    growth_high: float | None = field(default=None, metadata=OMIT)
    shape_share: float | None = field(default=None, metadata=OMIT)


@dataclass
class Trend(TrendFit):
    """The SimE fit (the headline), with every metric's fit under by_metric."""

    by_metric: dict[str, TrendFit] = field(default_factory=dict)


@dataclass
class Table1Entry:
    """The final layer's best match against one learner family (seed 003 Table 1)."""

    sweep: str
    k: Any
    similarity: float
    ci_low: float
    ci_high: float
    degenerate: bool | None = field(default=None, metadata=OMIT)


@dataclass
class Table1:
    sime: dict[str, Table1Entry]
    null: dict[str, dict[str, float]] | None = field(default=None, metadata=OMIT)


@dataclass
class Nulls:
    """Per layer: SimE against the zero predictor and a random-weights model; predicts ~0."""

    layer: list[int]
    predicts_zero: list[bool]
    relative_norm: list[float]
    sime: dict[str, list[float]]
    rule: str = (
        "a best match is degenerate when SimE(layer, zero predictor) >= its ci_low, or the layer predicts ~0 "
        "(||f|| < 0.1 ||y||)"
    )


@dataclass
class Span:
    layer: list[int]
    n_examples: list[int]
    residual: list[float]
    random_null: list[float]
    statistic: str = "root mean square over prompts of ||w - P_t w|| / ||w||"


@dataclass
class SpectralFit:
    """One bin variable's measurement per layer (probe/analysis/spectral.py): the local exponent p
    with its 90% interval, the best-fitting filter class and member (k on its axis, gain), its
    relative fit error, the runner-up class and the paired interval of (runner-up - best) error."""

    p: list[float]
    p_low: list[float]
    p_high: list[float]
    bins_used: list[int]
    min_r: list[float]
    max_r: list[float]
    non_filter: list[float]
    best_class: list[str]
    best_family: list[str]
    best_axis: list[str]
    best_k: list
    gain: list[float]
    error: list[float]
    runner_up: list[str]
    difference: list[float]
    diff_low: list[float]
    diff_high: list[float]
    separated: list[bool]


@dataclass
class Spectral:
    """Each layer's spectral filter on its induced weights: one verdict per layer over both bin
    variables ("gd", "precond_gd", "ridge", "least_squares", "... not separable from ...",
    "ambiguous: ...", "converged", "no response"), the exponent in the best family's own variable,
    each variable's fits, and the references' own exponents (the estimator's bias)."""

    layer: list[int]
    verdict: list[str]
    p: list[float]
    p_low: list[float]
    p_high: list[float]
    variable: list[str]
    by_variable: dict[str, SpectralFit]
    references: dict[str, dict[str, Any]]
    counts: dict[str, int]
    classes: dict[str, str]
    identities: str = (
        "Newton from alpha I is GD with 2^k steps of size alpha; the seeds' Newton (M_0 = alpha S) is "
        "S-preconditioned GD with 2^k steps: behaviour identifies the filter class and its rate, not which "
        "equivalent procedure computes it"
    )


@dataclass
class LayerAnalyses:
    """The layer analyses' blocks, each a top-level key of summary.json."""

    readout: Readout
    best_match: dict[str, dict[str, Match]]
    trend: dict[str, Trend]
    table1: Table1
    nulls: Nulls | None = field(default=None, metadata=OMIT)
    span: Span | None = field(default=None, metadata=OMIT)
    spectral: Spectral | None = field(default=None, metadata=OMIT)


# ----------------------------------------------------------------------------- running


def _run(c) -> StageTables:
    settings = LayerSettings.from_recipe(c.recipe, c.device, c.memory)
    res = analyse_layers(c.ckpt.model, c.ckpt.config.task, settings, progress=c.progress)
    alphas = getattr(res.readouts, "alpha", None)
    tables = {
        "readout": res.readout,
        "heatmap_cells": res.cells,
        "best_match": res.best,
        "table1": res.table1,
        "span": res.span,
        "nulls": res.nulls,
        "verdicts": res.verdicts,
        **spectral_tables(res.spectral),
    }
    data = {
        "trends": res.trends,
        "readout_alpha": None if alphas is None else list(map(float, alphas)),
        "readouts": res.readouts.to_json() if isinstance(res.readouts, LayerReadouts) else None,
        "timings": res.timings,
        **({"spectral_counts": res.spectral.counts} if res.spectral is not None else {}),
    }
    return StageTables(tables, data)


def spectral_tables(spectral) -> dict[str, pd.DataFrame]:
    """The spectral instrument's tables, named as the report writes them (none when it did not run)."""
    if spectral is None:
        return {}
    names = ("curves", "layers", "summary", "references", "fits")
    return {f"spectral_{name}": getattr(spectral, name) for name in names}


def _estimates(recipe, ckpt) -> list[budget.Estimate]:
    """Its knobs' memory and work on this checkpoint; a recipe whose SimW would be underdetermined
    is refused here, before any work."""
    m, shape, n, p = ckpt.config.model, shape_of(ckpt.config.model), ckpt.config.task.n_points, recipe.prompts
    queries = query_count(p.queries, m.n_dims)
    if recipe.similarity.simw and queries < m.n_dims:
        raise ConfigError(
            f"prompts.queries = {queries} is fewer than d = {m.n_dims} on {ckpt.name}: a layer's induced weights "
            f"(seed 003 eq. 11) solve for d unknowns from the queries, so SimW needs queries >= d "
            f"(0 means 4 d; or --set similarity.simw=false)"
        )
    out = budget.layer_estimates(shape, n, p, recipe.similarity, recipe.sweeps)
    if recipe.readout.method == "adam":
        out.append(budget.finetune_estimate(recipe.readout.finetune_steps, shape, p.train, n))
    if recipe.spectral.enabled and recipe.similarity.simw:
        members = sum(budget.grid_points(f) for f in reference_families(shape.d))
        out.append(
            budget.spectral_estimate(
                recipe.spectral.bins, min(p.induced, p.test), shape.layers + 1 + members, recipe.similarity.bootstrap
            )
        )
    return out


def _figures(t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
    recipe = context.recipe
    out = {"readout": figures.readout_error(t["readout"], fig_dir / "readout", context.ckpt.config.task.n_dims)[0]}
    titles = sweep_titles(recipe.sweeps)
    for sweep in recipe.sweeps:
        key = f"heatmap_{sweep.label}"
        out[key] = figures.heatmap_pair(
            t["heatmap_cells"], t["best_match"], sweep.label, sweep.axis, fig_dir / safe_name(key), titles=titles
        )[0]
        if sweep.axis:
            key = f"trend_{sweep.label}"
            out[key] = figures.best_match_trend(t["best_match"], sweep.label, "sime", fig_dir / safe_name(key), titles)[
                0
            ]
    if not t["span"].empty:
        out["span"] = figures.span(t["span"], fig_dir / "span")[0]
    if "spectral_curves" in t:
        for variable in t["spectral_curves"].variable.unique():
            key = f"spectral_{variable}"
            out[key] = figures.spectral_curves(t["spectral_curves"], variable, fig_dir / key)[0]
        out["spectral_exponents"] = figures.spectral_exponents(t["spectral_layers"], fig_dir / "spectral_exponents")[0]
    return out


# ----------------------------------------------------------------------------- summary.json blocks


def _summarise(t, recipe) -> LayerAnalyses:
    block = LayerAnalyses(
        readout=readout_block(t["readout"], t.ckpt.config.task.n_dims, recipe, t.data.get("readout_alpha")),
        best_match=best_match_block(t["best_match"], recipe),
        trend=trend_block(t.data.get("trends", []), recipe),
        table1=Table1(table1_block(t["table1"])),
    )
    if "nulls" in t and not t["nulls"].empty:
        block.nulls = nulls_block(t["nulls"])
        block.table1.null = {name: {"similarity": vals[-1]} for name, vals in block.nulls.sime.items()}
    if not t["span"].empty:
        layers = t["span"][t["span"].kind == "layer"]
        block.span = columns(layers, Span, layer=column(layers, "index"))
    if "spectral_summary" in t:
        block.spectral = spectral_block(t, t.data.get("spectral_counts", {}))
    return block


def readout_block(readout: pd.DataFrame, d: int, recipe, alpha) -> Readout:
    by_layer = readout[readout.n_examples >= 1].groupby("layer").error.mean()
    k = 2 * d + 1
    at_k = readout[readout.n_examples == k].set_index("layer").error if k in set(readout.n_examples) else None
    return Readout(
        layer=[int(i) for i in by_layer.index],
        error=[float(v) for v in by_layer.values],
        error_at_2d1=None if at_k is None else [float(at_k[l]) for l in by_layer.index],
        method=recipe.readout.method,
        alpha=alpha,
    )


def _widest_gd(recipe) -> str | None:
    """The GD sweep with the widest grid (the log grid in the shipped recipes): summary's `gd`."""
    gd = [s for s in recipe.sweeps if s.learner == "gd"]
    return max(gd, key=lambda s: max(s.grid.get("steps", [0]) or [0])).label if gd else None


def best_match_block(best: pd.DataFrame, recipe) -> dict[str, dict[str, Match]]:
    """learner -> metric -> Match. `gd` is the widest GD sweep and `newton` the first Newton
    sweep; each sweep also appears under its own label."""
    out: dict[str, dict[str, Match]] = {}
    for name, rows in best.groupby("sweep", sort=False):
        out[name] = {metric: columns(r.sort_values("layer"), Match) for metric, r in rows.groupby("metric")}
    widest = _widest_gd(recipe)
    if widest is not None:
        out["gd"] = out.get(widest, {})
    newton = [s for s in recipe.sweeps if s.learner == "newton"]
    if newton and "newton" not in out:
        out["newton"] = out.get(newton[0].label, {})
    return out


def nulls_block(nulls: pd.DataFrame) -> Nulls:
    first = nulls.drop_duplicates("layer").sort_values("layer")
    return Nulls(
        layer=column(first, "layer"),
        predicts_zero=[bool(v) for v in first.predicts_zero],
        relative_norm=column(first, "relative_norm"),
        sime={name: column(r.sort_values("layer"), "similarity") for name, r in nulls.groupby("null", sort=False)},
    )


def trend_block(trends: list[dict[str, Any]], recipe) -> dict[str, Trend]:
    """learner -> its SimE trend (the headline, as in seed 003 Fig. 3) with every metric's fit."""
    fits: dict[str, dict[str, TrendFit]] = {}
    for t in trends:
        fits.setdefault(t["learner"], {})[t["metric"]] = TrendFit(
            **{k: t[k] for k in TrendFit.__dataclass_fields__ if k in t}
        )
    out = {
        name: Trend(**vars(metrics.get("sime", next(iter(metrics.values())))), by_metric=metrics)
        for name, metrics in fits.items()
    }
    widest = _widest_gd(recipe)
    if widest in out:
        out["gd"] = out[widest]
    return out


def table1_block(table: pd.DataFrame, degenerate: bool = True) -> dict[str, Table1Entry]:
    return {
        r.family: Table1Entry(
            sweep=r.sweep,
            k=int_if_integral(r.k),
            similarity=r.similarity,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            degenerate=bool(getattr(r, "degenerate", False)) if degenerate else None,
        )
        for r in table.itertuples()
    }


def spectral_block(tables: dict[str, pd.DataFrame], counts: dict[str, int]) -> Spectral:
    """The spectral instrument's verdict per layer, each bin variable's fits and the references'
    exponents in their own variable (probe/analysis/spectral.py)."""
    summary, layers, refs = (tables[f"spectral_{name}"] for name in ("summary", "layers", "references"))
    own = refs[refs.own_variable]
    return Spectral(
        layer=[int(v) for v in summary.predictor],
        verdict=list(summary.verdict),
        p=column(summary, "p"),
        p_low=column(summary, "p_low"),
        p_high=column(summary, "p_high"),
        variable=list(summary.variable),
        by_variable={var: columns(rows, SpectralFit) for var, rows in layers.groupby("variable", sort=False)},
        references={r.family: {"variable": r.variable, "p_median": plain(r.p_median)} for r in own.itertuples()},
        counts={k: int(v) for k, v in counts.items()},
        classes=dict(CLASSES),
    )


def verdict_rows(table: pd.DataFrame | None, trends: dict[str, Trend]) -> list[dict[str, Any]]:
    """The paired verdicts (probe/analysis/verdicts.py), each a dict of summary.json's Verdict
    fields; where one cannot separate its pair, a pointer to the evidence table, with the two
    learners' iterations-per-layer trends when the report fitted them, named as the rate they are
    (they cannot separate the pair either)."""
    if table is None or table.empty:
        return []
    out = []
    for row in table.to_dict("records"):
        verdict = {k: plain(v) for k, v in row.items()}
        verdict["winner"] = verdict.get("winner") if isinstance(verdict.get("winner"), str) else None  # NaN: none
        fitted = [key for key in (verdict["a"], verdict["b"]) if key in trends and trends[key].verdict]
        if verdict["winner"] is None and fitted:
            verdict["evidence"] = (
                "see the evidence table; the iterations-per-layer trend ("
                + "; ".join(trends[k].verdict for k in fitted)
                + ") measures a rate and cannot separate them"
            )
        out.append(verdict)
    return out


# ----------------------------------------------------------------------------- findings and caveats


def _layers(layers: list) -> str:
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def _sime(block: LayerAnalyses, name: str) -> Match | None:
    return block.best_match.get(name, {}).get("sime")


def _unit(summary: Any, sweep: str) -> str:
    """What a sweep's k counts: its grid axis as the recipe names it (iterations, steps)."""
    for s in summary.recipe.get("sweeps", []):
        if s.get("label") == sweep and s.get("axis"):
            return s["axis"]
    return "iterations" if "newton" in sweep else "steps"


def _trend_lines(block: LayerAnalyses, summary: Any) -> list[str]:
    out = []
    for name, tr in block.trend.items():
        if name == "gd" or not tr.verdict:
            continue
        match, tail = _sime(block, name), ""
        if match is not None and match.k:
            tail = (
                f"; final layer {match.k[-1]} [{match.k_low[-1]}, {match.k_high[-1]}]"
                f"{' (at grid end)' if match.at_grid_end[-1] else ''}"
            )
        out.append(
            f"Layers vs {label(name, summary.titles)} (SimE, a convergence rate): "
            f"{trend_words(tr, _unit(summary, name))}{tail}."
        )
    return out


def _ranked(block: LayerAnalyses) -> list[tuple[str, Table1Entry]]:
    """Table 1's families, closest to the final layer first."""
    rows = [(fam, e) for fam, e in block.table1.sime.items() if fam != "null"]
    return sorted(rows, key=lambda r: -r[1].similarity)


def _table1_line(block: LayerAnalyses, summary: Any) -> str | None:
    from .findings import verdict_text

    rows = _ranked(block)
    if not rows:
        return None
    (fam, top), rest = rows[0], rows[1:]
    titles = summary.titles
    fam2, second = rest[0] if rest else (None, None)
    paired = next((v for v in summary.verdicts or [] if v.metric == "sime" and {v.a, v.b} == {fam, fam2}), None)
    # "closest" only where the paired verdict names the top family (or there is no runner-up)
    head = (
        "Final layer closest to"
        if second is None or (paired and paired.winner == fam)
        else "Final layer's highest SimE:"
    )
    text = f"{head} {label(fam, titles)} (SimE {top.similarity:.3f} [{top.ci_low:.3f}, {top.ci_high:.3f}])"
    if second is not None:
        text += f", runner-up {label(str(fam2), titles)} {second.similarity:.3f} [{second.ci_low:.3f}, {second.ci_high:.3f}]"
        if paired is not None:
            text += "; " + verdict_text(paired, titles)
    return text + "."


def _span_line(block: LayerAnalyses, d: int) -> str | None:
    span = block.span
    if span is None or not span.layer:
        return None
    last = max(span.layer)
    pairs = [
        (r, null)
        for l, t, r, null in zip(span.layer, span.n_examples, span.residual, span.random_null)
        if l == last and 1 <= t < d
    ]
    if not pairs:
        return None
    return (
        "Span of the examples (final layer): relative residual "
        + ", ".join(f"{r:.2f}" for r, _ in pairs)
        + f" at t = 1..{d - 1}, against "
        + ", ".join(f"{n:.2f}" for _, n in pairs)
        + " for a random vector."
    )


def _construction_line(block: LayerAnalyses, summary: Any) -> str | None:
    """For a planted model: its documented layer schedule, and whether the SimE matches recover it."""
    model = summary.checkpoint.model
    if str(model.get("planted") or "") not in CONSTRUCTIONS:  # "" for every family but planted
        return None
    c = CONSTRUCTIONS.get(model["planted"])
    if c.first is None:
        return None
    text = (
        f"Planted construction: {c.title}, {c.per_step} layer{'s' if c.per_step > 1 else ''} per {c.unit}, "
        f"first prediction at layer {c.first}"
    )
    if c.sibling:
        other = CONSTRUCTIONS.get(c.sibling)
        text += f" (the {'ReLU' if other.relu_attention else 'linear'}-attention construction needs {other.per_step})"
    match = _sime(block, c.matching_sweep)
    pairs = [(l, k) for l, k in zip(match.layer, match.k) if l >= c.first] if match else []
    by = f" of {label(c.matching_sweep, summary.titles)}" if c.matching_sweep != c.learner else ""
    if pairs:
        wrong = [l for l, k in pairs if k != c.layer_map(l)]
        text += (
            f"; the SimE best matches{by} recover this map at every predicting layer"
            if not wrong
            else f"; the SimE best matches{by} differ from it at {_layers(wrong)}"
        )
    return text + "."


CLASS_WORDS = {
    "gd": "GD class",
    "precond_gd": "S-preconditioned class (the seeds' Newton)",
    "ridge": "ridge",
    "least_squares": "least squares",
}


def _spectral_line(block: LayerAnalyses) -> str | None:
    """Each layer's spectral verdict, grouped, with the exponent where the verdict names one class."""
    sp = block.spectral
    if sp is None:
        return None
    groups: dict[str, list[str]] = {}
    for layer, verdict, p, lo, hi in zip(sp.layer, sp.verdict, sp.p, sp.p_low, sp.p_high):
        exponent = f" (p {p:.2f} [{lo:.2f}, {hi:.2f}])" if verdict in CLASS_WORDS and p is not None else ""
        groups.setdefault(CLASS_WORDS.get(verdict, verdict), []).append(f"{layer}{exponent}")
    parts = [f"{words}: {_layers(layers)}" for words, layers in groups.items()]
    return "Spectral filter per layer (exponent p: 1 GD class, 2 Newton class): " + "; ".join(parts) + "."


def _findings(block: LayerAnalyses, summary: Any) -> list[str | None]:
    d = summary.checkpoint.task["n_dims"]
    return [
        _construction_line(block, summary),
        *_trend_lines(block, summary),
        _table1_line(block, summary),
        _spectral_line(block),
        _span_line(block, d),
    ]


def _caveats(block: LayerAnalyses, summary: Any) -> list[str]:
    out = []
    nulls = block.nulls
    zero_layers = [l for l, z in zip(nulls.layer, nulls.predicts_zero) if z] if nulls else []
    if zero_layers:
        out.append(
            f"{_layers(zero_layers).capitalize()} predict{'s' if len(zero_layers) == 1 else ''} ~0 (||f|| < 0.1 ||y||): their matches are not "
            "distinguishable from predicting 0, whatever learner step they name."
        )
    swept = [s.get("label") for s in summary.recipe.get("sweeps", [])]
    for name in block.best_match:
        match = _sime(block, name)
        if match is None or (name in ("gd", "newton") and name not in swept):
            continue  # an alias of a swept label, said once under that label
        bad = [l for l, dg in zip(match.layer, match.degenerate or []) if dg and l not in zero_layers]
        if bad:
            out.append(
                f"{label(name, summary.titles)}: SimE matches at {_layers(bad)} are not distinguishable from "
                "predicting 0 (the zero predictor scores within their interval)."
            )
        ends = [l for l, e in zip(match.layer, match.at_grid_end) if e]
        if ends:
            out.append(
                f"{label(name, summary.titles)}: best matches at {_layers(ends)} lie at the grid's end; the "
                "true match may lie beyond it."
            )
    top = _ranked(block)
    if top and top[0][1].degenerate:
        out.append(
            "The final layer's closest learner is not distinguishable from predicting 0: Table 1 says nothing "
            "about which algorithm the model runs."
        )
    return out


# ----------------------------------------------------------------------------- the page


def _readable(frame: pd.DataFrame, titles: Titles) -> pd.DataFrame:
    """Human labels for a best-match-like table: learner and metric names, flags as words."""
    out = frame.copy()
    for col in ("sweep", "learner", "family", "metric"):
        if col in out:
            out[col] = out[col].map(lambda name: label(name, titles))
    for col, text in (("degenerate", "not distinguishable from 0"), ("at_grid_end", "at grid end")):
        if col in out:
            out[col] = out[col].map(lambda v, t=text: t if bool(v) else "")
    out = out.drop(columns=[c for c in ("predicts_zero",) if c in out])
    return out.rename(
        columns={
            "zero_similarity": "SimE vs zero predictor",
            "random_similarity": "SimE vs random model",
            "degenerate": "null check",
            "at_grid_end": "grid",
        }
    )


def _page_tables(block: LayerAnalyses, summary: Any, t: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The HTML tables its sections' macros read (templates/report.html.j2): readout, best, table1,
    verdicts, spectral, spectral_refs."""
    readout, titles = block.readout, summary.titles
    ro = pd.DataFrame({"layer": readout.layer, "error / d (mean over t >= 1)": readout.error})
    if readout.error_at_2d1:
        ro["error / d at t = 2d+1"] = readout.error_at_2d1
    out = {"readout": html_table(ro)}
    best, axes = t["best_match"], [s["label"] for s in summary.recipe.get("sweeps", []) if s.get("axis")]
    out["best"] = html_table(_readable(best[best.sweep.isin(axes)], titles), "{:.3f}")
    t1 = _readable(t["table1"], titles).rename(columns={"similarity": "SimE (final layer)"})
    if summary.compare is not None and "compare_table1" in t:
        other = _readable(t["compare_table1"][["family", "similarity"]], titles)
        name = Path(summary.compare["checkpoint"]["path"]).name
        t1 = t1.merge(other.rename(columns={"similarity": f"SimE ({name})"}), on="family", how="left")
    out["table1"] = html_table(t1, "{:.3f}")
    rows = [_verdict_row(v, titles) for v in summary.verdicts or [] if v.claim != "causal map"]  # those: the map check
    if rows:
        out["verdicts"] = html_table(pd.DataFrame(rows))
    if block.spectral is not None:
        out.update(_spectral_tables(block.spectral))
    return out


def _verdict_row(v: Any, titles: Titles) -> dict[str, str]:
    return {
        "metric": {"sime": "SimE", "simw": "SimW"}.get(v.metric, v.metric),
        "a": label(v.a, titles),
        "b": label(v.b, titles),
        "difference a - b": f"{v.difference:+.4f} [{v.ci_low:+.4f}, {v.ci_high:+.4f}]",
        "resolution": f"{v.resolution:.4f}",
        "verdict": v.verdict if v.winner is None else label(v.winner, titles) + " closer",
        "what separates them": v.evidence or "",
    }


def _spectral_tables(sp: Spectral) -> dict[str, str]:
    """Per layer: the verdict, p in the best family's own variable, and each variable's best member."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    rows = []
    for i, layer in enumerate(sp.layer):
        row = {
            "layer": layer,
            "verdict": sp.verdict[i],
            "p [90%]": f"{fmt(sp.p[i])} [{fmt(sp.p_low[i])}, {fmt(sp.p_high[i])}] ({sp.variable[i]})",
        }
        for var, fit in sp.by_variable.items():
            k = fit.best_k[i]
            member = fit.best_family[i] + ("" if k is None else f" {fit.best_axis[i]}={k:g}")
            row[f"best fit, {var}"] = f"{member}, error {fit.error[i]:.4f}"
            row[f"runner-up - best, {var}"] = (
                f"{fit.runner_up[i]} {fit.difference[i]:+.4f} [{fit.diff_low[i]:+.4f}, {fit.diff_high[i]:+.4f}]"
            )
        row["not a filter"] = f"{sp.by_variable[sp.variable[i]].non_filter[i]:.3f}"
        rows.append(row)
    refs = ", ".join(f"{name} {fmt(r['p_median'])} ({r['variable']})" for name, r in sp.references.items())
    return {"spectral": html_table(pd.DataFrame(rows)), "spectral_refs": refs}


# ----------------------------------------------------------------------------- evidence (issue 59)

RATE_ONLY = (
    "measures a convergence rate: GD whose step count doubles per layer gives the same linear Newton trend, "
    "so it cannot tell the two apart"
)
# the known-answer models on which the spectral filter names each candidate, and the tests that hold it
SPECTRAL_VALIDATED = {
    ("newton", "gd"): (
        "planted GD (GD class at every layer), planted Newton and Newton-ReLU (Newton class at every layer that "
        "holds an iterate), oracles running GD with 2^l steps and Newton from alpha I (GD class) and the seeds' "
        "Newton (Newton class): tests/test_spectral.py, tests/test_evidence.py"
    ),
}
SPECTRAL_SIDE = {"gd": "gd", "precond_gd": "newton", "ridge": "ridge", "least_squares": "least_squares"}


def _evidence(block: Any, summary: Any, a: str, b: str) -> list[dict[str, Any]]:
    """Table 1's paired verdicts, the best-match trend and the spectral filter on "a or b?" (read
    from the summary's verdicts, trend and spectral: a report's, or a study's evidence.Blocks)."""
    from .evidence import EQUIVALENCES

    equivalence = EQUIVALENCES.get((a, b), "")
    return [
        *_table1_rows(summary.verdicts, a, b, equivalence),
        *_trend_rows(summary.trend, a, b),
        *_spectral_rows(summary.spectral, a, b, equivalence),
    ]


def _table1_rows(verdicts: list | None, a: str, b: str, equivalence: str) -> list[dict[str, Any]]:
    out = []
    for metric, words in (("sime", "Table 1 SimE"), ("simw", "Table 1 SimW")):
        found = [
            v
            for v in verdicts or []
            if v.claim == "final layer (Table 1)" and v.metric == metric and {family_of(v.a), family_of(v.b)} == {a, b}
        ]
        if not found:
            continue
        v = found[0]
        sign = 1 if family_of(v.a) == a else -1  # differences as a - b
        lo, hi = sorted((sign * v.ci_low, sign * v.ci_high))
        out.append(
            {
                "instrument": words,
                "favours": None if v.winner is None else family_of(v.winner),
                "effect": f"final layer's similarity {a} - {b} {sign * v.difference:+.4f} [{lo:+.4f}, {hi:+.4f}], "
                f"resolution {v.resolution:.4f}",
                "difference": sign * v.difference,
                "ci_low": lo,
                "ci_high": hi,
                "resolution": v.resolution,
                "cannot_tell_apart": equivalence,
            }
        )
    return out


def _trend_rows(trend: dict[str, Trend], a: str, b: str) -> list[dict[str, Any]]:
    if (a, b) != ("newton", "gd"):
        return []
    fits = [tr.verdict for name, tr in trend.items() if name != "gd" and family_of(name) in (a, b) and tr.verdict]
    if not fits:
        return []
    return [
        {
            "instrument": "best-match trend (a rate)",
            "favours": None,
            "effect": "; ".join(fits),
            "cannot_tell_apart": RATE_ONLY,
        }
    ]


def _spectral_rows(sp: Spectral | None, a: str, b: str, equivalence: str) -> list[dict[str, Any]]:
    if sp is None or (a, b) not in (("newton", "gd"), ("ridge", "least_squares")):
        return []
    decided: dict[str, list[int]] = {}
    for i, layer in enumerate(sp.layer):
        fits = list(sp.by_variable.values())
        classes = {fit.best_class[i] for fit in fits}
        if len(classes) == 1 and all(fit.separated[i] for fit in fits) and not _flat(fits, i):
            decided.setdefault(SPECTRAL_SIDE[classes.pop()], []).append(layer)
    named = {s: l for s, l in decided.items() if s in (a, b)}
    favours = next(iter(named)) if len(named) == 1 else None
    words = "; ".join(f"{side} class at layers {', '.join(map(str, ls))}" for side, ls in decided.items())
    if len(named) > 1:
        words += " (layers disagree)"
    ps = [
        f"{layer}: {p:.2f} [{lo:.2f}, {hi:.2f}]"
        for layer, p, lo, hi in zip(sp.layer, sp.p, sp.p_low, sp.p_high)
        if p is not None
    ]
    effect = (words or "no layer decided between the classes") + (
        "; exponent p per layer " + ", ".join(ps) if ps else ""
    )
    return [
        {
            "instrument": "spectral filter",
            "favours": favours,
            "effect": effect,
            "validated_on": SPECTRAL_VALIDATED.get((a, b), ""),
            "cannot_tell_apart": equivalence,
        }
    ]


def _flat(fits, i: int) -> bool:
    """A layer that does not respond, or has converged, decides nothing."""
    return all(fit.max_r[i] is None or fit.max_r[i] <= 0.05 or (fit.min_r[i] or 0) > 0.95 for fit in fits)


register_stage(
    AnalysisStage(
        name="layers",
        settings=None,
        run=_run,
        block=LayerAnalyses,
        summarise=_summarise,
        title="Layers vs reference learners",
        description="Per-layer read-outs, each layer's similarity to every swept learner (best match, trend, Table 1, "
        "paired verdicts), the span test and each layer's spectral filter.",
        figures=_figures,
        estimates=_estimates,
        findings=_findings,
        caveats=_caveats,
        tables=_page_tables,
        evidence=_evidence,
        verdicts=lambda block, tables: verdict_rows(tables.get("verdicts"), block.trend),
        reads=SECTIONS,
        standalone=False,  # icl-probe layers, heatmap, spectral, readout, span (probe/cli)
        merged=True,
        sections=(
            ("Per-layer readout retraining", "readout", ""),
            ("Layers vs reference learners", "matching", ""),
            ("Table 1: final layer against each learner", "table1", ""),
            ("Span of the examples", "span", "span"),
            ("Spectral filter of each layer", "spectral", "spectral_exponents"),
        ),
    )
)
