"""summary.json: the report's numbers in one documented schema (see README, "summary.json").

Lists inside an entry are aligned by position (e.g. readout.layer[i] goes with readout.error[i]).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..checkpoint import LoadedCheckpoint
from ..interventions.pipeline import iteration_verdict
from ..interventions.steer import steering_summary
from ..provenance import display_path, stamp
from .recipe import Recipe

SCHEMA_VERSION = 2


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


def best_match_block(best: pd.DataFrame, recipe: Recipe) -> dict[str, Any]:
    """learner -> metric -> {layer, k, k_low, k_high, similarity, ci_low, ci_high}. `gd` is the
    GD sweep with the widest grid (the log grid in the shipped recipes); each sweep also
    appears under its own label."""
    out: dict[str, Any] = {}
    for label, rows in best.groupby("sweep", sort=False):
        columns = ["layer", "k", "k_low", "k_high", "similarity", "ci_low", "ci_high", "at_grid_end"]
        columns += [c for c in ("zero_similarity", "degenerate") if c in rows]
        out[label] = {
            metric: {c: _col(r.sort_values("layer"), c) for c in columns} for metric, r in rows.groupby("metric")
        }
    gd = [s for s in recipe.sweeps if s.learner == "gd"]
    if gd:
        widest = max(gd, key=lambda s: max(s.grid.get("steps", [0]) or [0]))
        out["gd"] = out.get(widest.label, {})
    newton = [s for s in recipe.sweeps if s.learner == "newton"]
    if newton and "newton" not in out:
        out["newton"] = out.get(newton[0].label, {})
    return out


def nulls_block(nulls: pd.DataFrame) -> dict[str, Any]:
    """Per layer: SimE against the zero predictor and a random-weights model; predicts ~0."""
    first = nulls.drop_duplicates("layer").sort_values("layer")
    return {
        "layer": _col(first, "layer"),
        "predicts_zero": [bool(v) for v in first.predicts_zero],
        "relative_norm": _col(first, "relative_norm"),
        "sime": {name: _col(r.sort_values("layer"), "similarity") for name, r in nulls.groupby("null", sort=False)},
        "rule": "a best match is degenerate when SimE(layer, zero predictor) >= its ci_low, or the layer predicts ~0 "
        "(||f|| < 0.1 ||y||)",
    }


def trend_block(trends: list[dict[str, Any]], recipe: Recipe) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in trends:
        entry = {k: t[k] for k in ("linear_r2", "exponential_r2", "slope", "growth", "verdict", "layers")}
        out.setdefault(t["learner"], {})[t["metric"]] = entry
    for label, metrics in list(out.items()):
        # the headline per learner is the SimE trend, as in seed 003 Fig. 3
        out[label] = {**metrics.get("sime", next(iter(metrics.values()))), "by_metric": metrics}
    gd = [s for s in recipe.sweeps if s.learner == "gd"]
    if gd:
        widest = max(gd, key=lambda s: max(s.grid.get("steps", [0]) or [0]))
        if widest.label in out:
            out["gd"] = out[widest.label]
    return out


def build_summary(built, ckpt: LoadedCheckpoint, recipe: Recipe, compare: LoadedCheckpoint | None) -> dict[str, Any]:
    """summary.json: provenance, then one block per analysis (README, "summary.json")."""
    t = built.tables
    icl = t["icl_error"]
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "checkpoint": checkpoint_block(ckpt),
        "recipe": recipe.to_dict(),
        **stamp(),
        "seed": recipe.prompts.seed,
        "timings": built.timings,
        "cached_stages": [name for name, hit in built.cached.items() if hit],
        "icl_error": {
            c: _col(icl, c)
            for c in ("n_examples", "model", "model_lo", "model_hi", "least_squares", "knn3", "averaging")
        },
        "readout": readout_block(t["readout"], ckpt.config.task.n_dims, recipe, built.data.get("readout_alpha")),
        "best_match": best_match_block(t["best_match"], recipe),
        "trend": trend_block(built.data.get("trends", []), recipe),
        "table1": {"sime": table1_block(t["table1"])},
    }
    if "nulls" in t and not t["nulls"].empty:
        summary["nulls"] = nulls_block(t["nulls"])
        summary["table1"]["null"] = {name: {"similarity": vals[-1]} for name, vals in summary["nulls"]["sime"].items()}
    summary.update(optional_blocks(built))
    if compare is not None:
        summary["compare"] = {
            "checkpoint": {"path": display_path(compare.path), "format": compare.format, "sha256": compare.sha256},
            "table1": {"sime": table1_block(t["compare_table1"], degenerate=False)},
            "readout": {
                "layer": sorted(int(i) for i in t["compare_readout"].layer.unique()),
                "error": [
                    float(v)
                    for v in t["compare_readout"][t["compare_readout"].n_examples >= 1]
                    .groupby("layer")
                    .error.mean()
                    .values
                ],
            },
        }
    return summary


def checkpoint_block(ckpt: LoadedCheckpoint) -> dict[str, Any]:
    meta = {key: value for key, value in ckpt.meta.items() if key in ("train_step", "train_seconds")}
    task = {**ckpt.config.task.__dict__, "mixture_weights": list(ckpt.config.task.mixture_weights)}
    return {
        "path": display_path(ckpt.path),
        "format": ckpt.format,
        "sha256": ckpt.sha256,
        "name": ckpt.name,
        "model": ckpt.config.model.__dict__,
        "task": task,
        "parameters": int(sum(p.numel() for p in ckpt.model.parameters())),
        **meta,
    }


def readout_block(readout: pd.DataFrame, d: int, recipe: Recipe, alpha) -> dict[str, Any]:
    by_layer = readout[readout.n_examples >= 1].groupby("layer").error.mean()
    k = 2 * d + 1
    at_k = readout[readout.n_examples == k].set_index("layer").error if k in set(readout.n_examples) else None
    return {
        "layer": [int(i) for i in by_layer.index],
        "error": [float(v) for v in by_layer.values],
        "error_at_2d1": None if at_k is None else [float(at_k[l]) for l in by_layer.index],
        "method": recipe.readout.method,
        "alpha": alpha,
        "error_definition": "mean over n_examples >= 1 of squared error / d on held-out prompts",
    }


def table1_block(table: pd.DataFrame, degenerate: bool = True) -> dict[str, Any]:
    out = {}
    for r in table.itertuples():
        entry = {
            "sweep": r.sweep,
            "k": _int_if_integral(r.k),
            "similarity": r.similarity,
            "ci_low": r.ci_low,
            "ci_high": r.ci_high,
        }
        if degenerate:
            entry["degenerate"] = bool(getattr(r, "degenerate", False))
        out[r.family] = entry
    return out


def optional_blocks(built) -> dict[str, Any]:
    """Blocks of the stages a recipe may leave out: ReLU R^2, span, probes, forgetting, interventions."""
    t = built.tables
    out: dict[str, Any] = {}
    if "icl_r2" in t:
        out["icl_r2"] = {c: _col(t["icl_r2"], c) for c in t["icl_r2"].columns}
    if not t["span"].empty:
        layers = t["span"][t["span"].kind == "layer"]
        out["span"] = {
            "layer": _col(layers, "index"),
            "n_examples": _col(layers, "n_examples"),
            "residual": _col(layers, "residual"),
            "random_null": _col(layers, "random_null"),
            "statistic": "root mean square over prompts of ||w - P_t w|| / ||w||",
        }
    if "probes" in t:
        out["probes"] = probe_summary(t["probes"])
        out["probes"]["target_normalisation"] = (
            "standardised per prefix and coordinate with training-prompt mean and std"
        )
    if "forgetting" in t:
        out["forgetting"] = {
            name: {"gap": _col(r, "gap"), "error": _col(r, "error")} for name, r in t["forgetting"].groupby("predictor")
        }
    if "order" in t:
        out["order_sensitivity"] = order_block(t["order"])
    if "steering" in t:
        out["steering"] = steering_summary(t["steering"])
    if "interventions" in built.data:
        block = dict(built.data["interventions"])
        block["verdicts"] = [iteration_verdict(label, entry) for label, entry in block.get("iteration", {}).items()]
        out["interventions"] = block
    return out


def order_block(table: pd.DataFrame) -> dict[str, Any]:
    """model: per prefix (as a string key) the order share by layer with intervals; learners: per
    learner and prefix, the same share (probe/analysis/order.py)."""
    model = table[table.predictor == "model"]
    block: dict[str, Any] = {
        "prefixes": sorted(int(t) for t in table.prefix.unique()),
        "layer": sorted(int(l) for l in model.layer.unique()),
        "model": {
            str(t): {c: _col(r.sort_values("layer"), c) for c in ("sensitivity", "ci_low", "ci_high")}
            for t, r in model.groupby("prefix")
        },
        "learners": {
            name: {
                str(int(r.prefix)): {"sensitivity": r.sensitivity, "ci_low": r.ci_low, "ci_high": r.ci_high}
                for r in rows.itertuples()
            }
            for name, rows in table[table.predictor != "model"].groupby("predictor", sort=False)
        },
        "definition": "mean over prompts of the variance of the prediction across orderings of the first t examples, "
        "divided by the variance across prompts of its mean over orderings (0: order-free)",
    }
    return block


def probe_summary(table: pd.DataFrame) -> dict:
    """Per target and kind: R^2 by layer (mean over prefixes >= d... all probed prefixes), with
    the random-model and shuffled controls aligned by layer, and the best layer."""
    out: dict = {}
    for (target, kind), rows in table.groupby(["target", "kind"]):
        by = rows.groupby(["control", "layer"]).r2.mean()
        layers = sorted(rows.layer.unique())
        main = [float(by.get(("none", l), np.nan)) for l in layers]
        entry: dict[str, Any] = {
            "layer": layers,
            "r2": main,
            "control_r2": [float(by.get(("random_model", l), np.nan)) for l in layers],
            "shuffled_r2": [float(by.get(("shuffled", l), np.nan)) for l in layers],
        }
        entry["best_layer"] = int(layers[int(np.nanargmax(main))])
        own = rows[rows.control == "none"]
        entry["by_prefix"] = {
            int(t): [float(v) for v in g.groupby("layer").r2.mean().reindex(layers)] for t, g in own.groupby("prefix")
        }
        if "converged" in rows:
            entry["converged_share"] = float(own.converged.mean())
            entry["max_steps_used"] = int(own.steps.max())
        out.setdefault(target, {})[kind] = entry
    return out
