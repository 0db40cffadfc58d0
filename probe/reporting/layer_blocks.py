"""The layer analyses' summary.json blocks (probe/stages/layers.py): read-outs, best
matches, trends, Table 1 with its nulls, the span test, and the paired verdicts' rows, each built
from the stage's tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core.stages import OMIT
from .columns import column, columns, int_if_integral, plain


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
    """One learner's best match per layer under one metric (Fu et al. 2024, eq. 9-12), 90% intervals."""

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
    """Linear and exponential fits of the best k against layer (Fu et al. 2024, Fig. 3)."""

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
    """The final layer's best match against one learner family (Fu et al. 2024, Table 1)."""

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
class LayerAnalyses:
    """The layer analyses' blocks, each a top-level key of summary.json."""

    best_match: dict[str, dict[str, Match]]
    trend: dict[str, Trend]
    table1: Table1
    nulls: Nulls | None = field(default=None, metadata=OMIT)
    span: Span | None = field(default=None, metadata=OMIT)


def layer_analyses(t, recipe) -> LayerAnalyses:
    """The layer analyses' blocks from the report's tables (a StageTables: its data and checkpoint too)."""
    block = LayerAnalyses(
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
    """learner -> its SimE trend (the headline, as in Fu et al. 2024, Fig. 3) with every metric's fit."""
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
