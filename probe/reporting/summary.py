"""summary.json from the report's tables: a `Summary` (probe/reporting/schema.py, README "summary.json")."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pandas as pd

from ..core.provenance import display_path, stamp
from ..core.stages import StageTables, by_block_key, registered
from ..io.checkpoint import LoadedCheckpoint
from .evidence import evidence
from .recipe import Recipe
from .schema import (
    SCHEMA_VERSION,
    CheckpointInfo,
    IclError,
    Match,
    Nulls,
    Readout,
    Span,
    Spectral,
    SpectralFit,
    Summary,
    Table1,
    Table1Entry,
    Trend,
    TrendFit,
    Verdict,
)


def _col(frame: pd.DataFrame, name: str) -> list:
    """A column as a JSON list: NaN -> null, and integral counts (layers, steps) as integers."""
    out = []
    for v in frame[name].tolist():
        if isinstance(v, float) and np.isnan(v):
            v = None
        elif isinstance(v, float) and name in ("k", "k_low", "k_high", "layer", "n_examples", "gap") and v.is_integer():
            v = int(v)
        out.append(v)
    return out


def _int_if_integral(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _columns(frame: pd.DataFrame, kind: type, **extra) -> Any:
    """A dataclass whose list fields are the frame's columns of the same names (JSON lists)."""
    names = [f.name for f in fields(kind) if f.name in frame and f.name not in extra]
    return kind(**{name: _col(frame, name) for name in names}, **extra)


def _widest_gd(recipe: Recipe) -> str | None:
    """The GD sweep with the widest grid (the log grid in the shipped recipes): summary's `gd`."""
    gd = [s for s in recipe.sweeps if s.learner == "gd"]
    return max(gd, key=lambda s: max(s.grid.get("steps", [0]) or [0])).label if gd else None


def best_match_block(best: pd.DataFrame, recipe: Recipe) -> dict[str, dict[str, Match]]:
    """learner -> metric -> Match. `gd` is the widest GD sweep and `newton` the first Newton
    sweep; each sweep also appears under its own label."""
    out: dict[str, dict[str, Match]] = {}
    for label, rows in best.groupby("sweep", sort=False):
        out[label] = {metric: _columns(r.sort_values("layer"), Match) for metric, r in rows.groupby("metric")}
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
        layer=_col(first, "layer"),
        predicts_zero=[bool(v) for v in first.predicts_zero],
        relative_norm=_col(first, "relative_norm"),
        sime={name: _col(r.sort_values("layer"), "similarity") for name, r in nulls.groupby("null", sort=False)},
    )


def trend_block(trends: list[dict[str, Any]], recipe: Recipe) -> dict[str, Trend]:
    """learner -> its SimE trend (the headline, as in seed 003 Fig. 3) with every metric's fit."""
    fits: dict[str, dict[str, TrendFit]] = {}
    for t in trends:
        fits.setdefault(t["learner"], {})[t["metric"]] = TrendFit(
            **{k: t[k] for k in TrendFit.__dataclass_fields__ if k in t}
        )
    out = {
        label: Trend(**vars(metrics.get("sime", next(iter(metrics.values())))), by_metric=metrics)
        for label, metrics in fits.items()
    }
    widest = _widest_gd(recipe)
    if widest in out:
        out["gd"] = out[widest]
    return out


def build_summary(built, ckpt: LoadedCheckpoint, recipe: Recipe, compare: LoadedCheckpoint | None) -> Summary:
    """summary.json: provenance, then one block per analysis (README, "summary.json")."""
    t = built.tables
    summary = Summary(
        schema_version=SCHEMA_VERSION,
        checkpoint=checkpoint_block(ckpt),
        recipe=recipe.to_dict(),
        **stamp(),
        seed=recipe.prompts.seed,
        timings=built.timings,
        cached_stages=[name for name, hit in built.cached.items() if hit],
        icl_error=_columns(t["icl_error"], IclError),
        readout=readout_block(t["readout"], ckpt.config.task.n_dims, recipe, built.data.get("readout_alpha")),
        best_match=best_match_block(t["best_match"], recipe),
        trend=trend_block(built.data.get("trends", []), recipe),
        table1=Table1(table1_block(t["table1"])),
        **optional_blocks(built),
    )
    summary.verdicts = verdicts_block(t.get("verdicts"), summary.trend)
    if "nulls" in t and not t["nulls"].empty:
        summary.nulls = nulls_block(t["nulls"])
        summary.table1.null = {name: {"similarity": vals[-1]} for name, vals in summary.nulls.sime.items()}
    summary.stages = {
        declared.block_key: declared.summarise(StageTables(t, built.data), recipe)
        for name, declared in registered().items()
        if name in built.timings
    }
    added = [Verdict(**v) for key, block in summary.stages.items() for v in _stage_verdicts(key, block)]
    summary.verdicts = (summary.verdicts or []) + added if added else summary.verdicts
    summary.evidence = evidence(summary) or None  # last: it reads every block above
    if compare is not None:
        other = t["compare_readout"]
        summary.compare = {
            "checkpoint": {"path": display_path(compare.path), "format": compare.format, "sha256": compare.sha256},
            "table1": {"sime": table1_block(t["compare_table1"], degenerate=False)},
            "readout": {
                "layer": sorted(int(i) for i in other.layer.unique()),
                "error": [float(v) for v in other[other.n_examples >= 1].groupby("layer").error.mean().values],
            },
        }
    return summary


def checkpoint_block(ckpt: LoadedCheckpoint) -> CheckpointInfo:
    task = {**ckpt.config.task.__dict__, "mixture_weights": list(ckpt.config.task.mixture_weights)}
    return CheckpointInfo(
        path=display_path(ckpt.path),
        format=ckpt.format,
        sha256=ckpt.sha256,
        name=ckpt.name,
        model=ckpt.config.model.__dict__,
        task=task,
        parameters=int(sum(p.numel() for p in ckpt.model.parameters())),
        **{key: value for key, value in ckpt.meta.items() if key in ("train_step", "train_seconds")},
    )


def readout_block(readout: pd.DataFrame, d: int, recipe: Recipe, alpha) -> Readout:
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


def table1_block(table: pd.DataFrame, degenerate: bool = True) -> dict[str, Table1Entry]:
    return {
        r.family: Table1Entry(
            sweep=r.sweep,
            k=_int_if_integral(r.k),
            similarity=r.similarity,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            degenerate=bool(getattr(r, "degenerate", False)) if degenerate else None,
        )
        for r in table.itertuples()
    }


def verdicts_block(table: pd.DataFrame | None, trends: dict[str, Trend]) -> list[Verdict] | None:
    """The paired verdicts; where one cannot separate its pair, a pointer to the evidence table,
    with the two learners' iterations-per-layer trends when the report fitted them, named as the
    rate they are (they cannot separate the pair either)."""
    if table is None or table.empty:
        return None
    out = []
    for row in table.to_dict("records"):
        verdict = Verdict(**{k: _plain(v) for k, v in row.items()})
        verdict.winner = verdict.winner if isinstance(verdict.winner, str) else None  # the table's None is NaN
        fitted = [key for key in (verdict.a, verdict.b) if key in trends and trends[key].verdict]
        if verdict.winner is None and fitted:
            verdict.evidence = (
                "see the evidence table; the iterations-per-layer trend ("
                + "; ".join(trends[k].verdict for k in fitted)
                + ") measures a rate and cannot separate them"
            )
        out.append(verdict)
    return out


def _stage_verdicts(key: str, block: Any) -> list[dict[str, Any]]:
    """The paired verdicts a registered analysis adds (its `verdicts`: the causal map checks)."""
    hook = by_block_key()[key].verdicts
    return hook(block) if hook is not None else []


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value


def optional_blocks(built) -> dict[str, Any]:
    """Blocks of the built-in stages a recipe may leave out: ReLU R^2, span, spectral."""
    t = built.tables
    out: dict[str, Any] = {}
    if "icl_r2" in t:
        out["icl_r2"] = {c: _col(t["icl_r2"], c) for c in t["icl_r2"].columns}
    if not t["span"].empty:
        layers = t["span"][t["span"].kind == "layer"]
        out["span"] = _columns(layers, Span, layer=_col(layers, "index"))
    if "spectral_summary" in t:
        out["spectral"] = spectral_block(t, built.data.get("spectral_counts", {}))
    return out


def spectral_block(tables: dict[str, pd.DataFrame], counts: dict[str, int]) -> Spectral:
    """The spectral instrument's verdict per layer, each bin variable's fits and the references'
    exponents in their own variable (probe/analysis/spectral.py)."""
    from ..analysis.spectral import CLASSES

    summary, layers, refs = (tables[f"spectral_{name}"] for name in ("summary", "layers", "references"))
    own = refs[refs.own_variable]
    return Spectral(
        layer=[int(v) for v in summary.predictor],
        verdict=list(summary.verdict),
        p=_col(summary, "p"),
        p_low=_col(summary, "p_low"),
        p_high=_col(summary, "p_high"),
        variable=list(summary.variable),
        by_variable={var: _columns(rows, SpectralFit) for var, rows in layers.groupby("variable", sort=False)},
        references={r.family: {"variable": r.variable, "p_median": _plain(r.p_median)} for r in own.itertuples()},
        counts={k: int(v) for k, v in counts.items()},
        classes=dict(CLASSES),
    )
