"""Layer-vs-algorithm heatmaps (Fu et al. 2024, Def. 4, Fig. 3): every layer predictor against every
reference learner over its grid, by SimE and SimW, with best matches and a trend test."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.settings import SweepSettings
from ..learners import LearnerResult, run_learner
from .similarity import best_match, induced_weights, sime, similarity_frame, simw


def run_sweep(
    sweep: SweepSettings, xs: torch.Tensor, ys: torch.Tensor, queries: torch.Tensor | None, device: str = "cpu"
) -> LearnerResult:
    return run_learner(
        sweep.learner, xs.to(device), ys.to(device), None if queries is None else queries.to(device), **sweep.grid
    )


def learner_weights(result: LearnerResult, queries: torch.Tensor) -> torch.Tensor:
    """A learner's weights, induced from its query predictions when it has none (e.g. k-NN)."""
    if result.weights is not None:
        return result.weights
    if result.query_preds is None:
        raise ValueError(f"learner {result.name!r} has neither weights nor query predictions to induce them from")
    return induced_weights(result.query_preds, queries.to(result.query_preds.device))


def compare_layers(
    layer_preds: np.ndarray,
    layer_weights: np.ndarray | None,
    ys: torch.Tensor,
    sweep: SweepSettings,
    result: LearnerResult,
    queries: torch.Tensor | None,
    include_first: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Heatmap cells and best matches of one sweep against all layers, for SimE (and SimW when
    layer weights are given). Returns (cells, best) tidy tables; best's K_DRAWS column holds each
    row's best k on every prompt resample (paired across layers) for `trend`'s intervals, and is
    dropped (`without_draws`) before the table leaves the analysis."""
    lp = torch.as_tensor(layer_preds, dtype=torch.float64)
    ys = ys.to(torch.float64).cpu()
    metrics = {"sime": sime(lp, result.preds.cpu(), ys, include_first)}
    if layer_weights is not None:
        if queries is None:
            raise ValueError("SimW needs the fresh queries the layer weights were induced from")
        metrics["simw"] = simw(
            torch.as_tensor(layer_weights, dtype=torch.float64), learner_weights(result, queries).cpu()
        )
    cells, best = [], []
    for metric, values in metrics.items():
        frame = similarity_frame(values, metric, "layer", sweep.label, result.grid, n_boot=n_boot, seed=seed)
        cells.append(
            frame.drop(columns=["a"]).rename(columns={"a_index": "layer", "b": "sweep", "b_index": "grid_index"})
        )
        table = best_match(values, n_boot=n_boot, seed=seed)
        axis_values = [g.get(sweep.axis, i) if sweep.axis else i for i, g in enumerate(result.grid)]
        draws = np.asarray(axis_values, dtype=object)[table.attrs["draws"]]  # (n_boot, layers): k per resample
        best.append(
            pd.DataFrame(
                {
                    "sweep": sweep.label,
                    "learner": sweep.learner,
                    "metric": metric,
                    "layer": table.a_index,
                    "k": [axis_values[i] for i in table.best_index],
                    "k_low": [axis_values[i] for i in table.best_index_low],
                    "k_high": [axis_values[i] for i in table.best_index_high],
                    "similarity": table.similarity,
                    "ci_low": table.ci_low,
                    "ci_high": table.ci_high,
                    "at_grid_end": (table.best_index == len(result.grid) - 1)
                    & (sweep.axis is not None)
                    & (len(result.grid) > 1),
                    K_DRAWS: list(draws.T),
                }
            )
        )
    return pd.concat(cells, ignore_index=True), pd.concat(best, ignore_index=True)


K_DRAWS = "k_draws"  # best's column of per-resample best k (compare_layers), read by `trend`
INCONCLUSIVE = "inconclusive (fewer than 3 layers with a varying, unconverged best match)"
TREND_MIN_R2 = 0.8  # below this on both fits the best k has no trend with depth worth a shape
SHAPE_MIN_SHARE = 0.8  # the chosen shape must win on this share of prompt resamples to be named alone
LEVEL = 0.90  # the trend's intervals, as best_match's


def without_draws(best: pd.DataFrame) -> pd.DataFrame:
    """best without the per-resample column (what tables, CSVs and reports keep)."""
    return best.drop(columns=[K_DRAWS], errors="ignore")


def trend_words(fit: Any, unit: str) -> str:
    """A trend fit (`trend`'s fields, or summary.json's) in words: its shape, rate with its
    interval over prompt resamples, and both R^2; the one place the words are made (the report
    renders them from the fields)."""
    if fit.linear_r2 is None:
        return INCONCLUSIVE
    r2 = f"R^2 linear {fit.linear_r2:.2f}, exponential {fit.exponential_r2:.2f}"
    if max(fit.linear_r2, fit.exponential_r2) < TREND_MIN_R2:
        return f"no trend: neither fit reaches R^2 {TREND_MIN_R2} ({r2})"
    linear = f"about {fit.slope:.1f}{_interval(fit, 'slope', '.1f')} {unit} per layer"
    growth = f"about x{fit.growth:.2f}{_interval(fit, 'growth', '.2f')} per layer"
    share = getattr(fit, "shape_share", None)
    if share is not None and share < SHAPE_MIN_SHARE:
        return (
            f"shape undecided (the better fit wins on {share:.0%} of prompt resamples): linear {linear} or "
            f"exponential {growth} ({r2})"
        )
    agree = "" if share is None else f"; this shape on {share:.0%} of prompt resamples"
    if fit.linear_r2 >= fit.exponential_r2:
        return f"linear, {linear} ({r2}{agree})"
    return f"exponential, {growth} ({r2}{agree})"


def _interval(fit: Any, name: str, fmt: str) -> str:
    low, high = getattr(fit, f"{name}_low", None), getattr(fit, f"{name}_high", None)
    return "" if low is None or high is None else f" [{low:{fmt}}, {high:{fmt}}]"


def _exponential_fit(x: np.ndarray, ks: np.ndarray, iterations: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Least squares on k itself of k = exp(c0 + c1 x), one fit per row of ks (R, n): damped
    Gauss-Newton (Levenberg-Marquardt) from the log-linear fit, batched over rows. Returns (c0, c1)."""
    logs = np.log(np.clip(ks, ks[ks > 0].min() if (ks > 0).any() else 1.0, None))
    xc = x - x.mean()
    c1 = (logs - logs.mean(-1, keepdims=True)) @ xc / (xc @ xc)
    c0 = logs.mean(-1) - c1 * x.mean()
    damping = np.full(len(ks), 1e-3)

    def sse(a, b):
        return ((ks - np.exp(a[:, None] + b[:, None] * x)) ** 2).sum(-1)

    current = sse(c0, c1)
    for _ in range(iterations):
        f = np.exp(c0[:, None] + c1[:, None] * x)
        r, j1 = ks - f, f * x
        a00, a01, a11 = (f * f).sum(-1), (f * j1).sum(-1), (j1 * j1).sum(-1)
        g0, g1 = (f * r).sum(-1), (j1 * r).sum(-1)
        a00d, a11d = a00 * (1 + damping), a11 * (1 + damping)
        det = a00d * a11d - a01**2
        with np.errstate(divide="ignore", invalid="ignore"):
            d0, d1 = (a11d * g0 - a01 * g1) / det, (a00d * g1 - a01 * g0) / det
        ok = np.isfinite(d0) & np.isfinite(d1)
        t0, t1 = np.where(ok, c0 + d0, c0), np.where(ok, c1 + d1, c1)
        with np.errstate(over="ignore", invalid="ignore"):
            trial = sse(t0, t1)
        better = ok & np.isfinite(trial) & (trial < current)
        c0, c1, current = np.where(better, t0, c0), np.where(better, t1, c1), np.where(better, trial, current)
        damping = np.where(better, damping / 10, damping * 10)
    return c0, c1


def _fits(layers: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Fits of ks (R, n) against layers (n,), one per row, both by least squares on k itself: the
    linear slope, the exponential fit's growth factor per layer (`_exponential_fit`), and both
    fits' R^2."""
    x = layers - layers.mean()
    slope = (ks - ks.mean(-1, keepdims=True)) @ x / (x @ x)
    lin = ks.mean(-1, keepdims=True) + slope[:, None] * x
    c0, c1 = _exponential_fit(layers, ks)
    exp = np.exp(c0[:, None] + c1[:, None] * layers)
    total = ((ks - ks.mean(-1, keepdims=True)) ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2_lin = 1 - ((ks - lin) ** 2).sum(-1) / total
        r2_exp = 1 - ((ks - exp) ** 2).sum(-1) / total
    return slope, np.exp(c1), r2_lin, r2_exp


def trend(best: pd.DataFrame, learner: str, metric: str = "sime", unit: str | None = None) -> dict[str, Any]:
    """Linear and exponential fits of the best-matching k against the layer index, over layers
    l >= 1 before convergence (best k neither at the start nor at the end of the grid) whose match
    is not degenerate (no better than a null predictor, `nulls.flag_degenerate`). A convergence-rate
    measurement: GD whose step count doubles per layer reads "Newton: linear" (the evidence table
    says so); below TREND_MIN_R2 on both fits the words say "no trend".

    Linear: k = a l + b. Exponential: k = c g^l, fitted by least squares on k itself (started
    from the log-linear fit), so both R^2 are measured on the same scale. Intervals (LEVEL): the
    same layers refitted the same way on every prompt resample of the best matches (best's
    K_DRAWS, paired across layers), with `shape_share`, the
    share of resamples on which the point estimate's shape fits better; below SHAPE_MIN_SHARE the
    words name both shapes.
    """
    rows = best[(best.sweep == learner) & (best.metric == metric) & (best.layer >= 1) & ~best.at_grid_end]
    rows = rows[rows.k > 0]
    if "degenerate" in rows:  # a match no better than a null predictor names no k: left out in every metric
        rows = rows[~rows.degenerate.astype(bool)]
    layers, ks = rows.layer.to_numpy(float), rows.k.to_numpy(float)
    out: dict[str, Any] = {"learner": learner, "metric": metric, "layers": rows.layer.tolist()}
    if len(rows) < 3 or np.ptp(ks) == 0:
        out.update(
            linear_r2=None,
            exponential_r2=None,
            slope=None,
            growth=None,
            verdict=f"{learner}: {INCONCLUSIVE}",
        )
        return out
    (slope,), (growth,), (lin_r2,), (exp_r2,) = _fits(layers, ks[None])
    lin_r2, exp_r2 = float(lin_r2), float(exp_r2)
    out.update(linear_r2=lin_r2, exponential_r2=exp_r2, slope=float(slope), growth=float(growth))
    if K_DRAWS in rows:
        draws = np.stack([np.asarray(d, dtype=float) for d in rows[K_DRAWS]], axis=-1)  # (R, layers)
        slope, growth, r2_lin, r2_exp = _fits(layers, draws)
        q = [(1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100]
        linear_won = np.nan_to_num(r2_lin, nan=-np.inf) >= np.nan_to_num(r2_exp, nan=-np.inf)
        out.update(
            slope_low=float(np.percentile(slope, q[0])),
            slope_high=float(np.percentile(slope, q[1])),
            growth_low=float(np.percentile(growth, q[0])),
            growth_high=float(np.percentile(growth, q[1])),
            shape_share=float(linear_won.mean() if lin_r2 >= exp_r2 else 1 - linear_won.mean()),
        )
    unit = unit or ("iterations" if "newton" in learner else "steps")
    out["verdict"] = f"{learner}: " + trend_words(SimpleNamespace(**out), unit)
    return out


def family_of(sweep_label: str) -> str:
    """A sweep's learner family in Table 1: its label without a _linear / _log grid suffix."""
    return re.sub(r"_(linear|log)$", "", sweep_label)


def table1(best: pd.DataFrame, last_layer: int, metric: str = "sime") -> pd.DataFrame:
    """Fu et al. 2024, Table 1: the final layer's best similarity with each learner family (its best sweep),
    one row per family in the order the sweeps are given (stable across models), with `rank`
    (1: the most similar)."""
    rows = best[(best.layer == last_layer) & (best.metric == metric)]
    family = rows.sweep.map(family_of)
    order = {f: i for i, f in enumerate(dict.fromkeys(family))}
    rows = rows.assign(family=family).sort_values("similarity", ascending=False, kind="stable")
    rows = rows.drop_duplicates("family").assign(rank=lambda r: range(1, len(r) + 1))
    rows = rows.sort_values("family", key=lambda f: f.map(order), kind="stable")
    extra = [c for c in ("zero_similarity", "random_similarity", "degenerate") if c in rows]
    return rows[["family", "sweep", "k", "rank", "similarity", "ci_low", "ci_high", *extra]].reset_index(drop=True)
