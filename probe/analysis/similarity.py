"""Similarity between predictors, and hyper-parameter matching (Fu et al. 2024, §3.4, Def. 4; Akyurek et al. 2023, §3.2).

Predictors are given as predictions (A, B, n) at x_{t+1} after t examples, query predictions
(A, B, n, Q) on shared fresh queries (B, Q, d), or weight vectors (A, B, n, d). All metrics return
per-prompt values (A, K, B) for every pair (a, k) of two families, so one call fills a heatmap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .stats import bootstrap_mean, resampled_means

EPS = 1e-12


def residuals(preds: Tensor, ys: Tensor, include_first: bool = False) -> Tensor:
    """Error vectors E (Fu et al. 2024, eq. 9): preds (A, B, n) - ys (B, n) at t = 1..n-1 (x_2..x_n).

    `include_first=True` also keeps t = 0 (no example seen), as that paper's code does.
    """
    start = 0 if include_first else 1
    return preds[..., start:].double() - ys[..., start:].double()


def cosine_matrix(u: Tensor, v: Tensor) -> Tensor:
    """Cosine of u (A, B, m) with v (K, B, m) over the last dim -> (A, K, B); 0 for a zero vector."""
    un = u / u.norm(dim=-1, keepdim=True).clamp_min(EPS)
    vn = v / v.norm(dim=-1, keepdim=True).clamp_min(EPS)
    return torch.einsum("abm,kbm->akb", un, vn)


def sime(preds_a: Tensor, preds_b: Tensor, ys: Tensor, include_first: bool = False) -> Tensor:
    """Similarity of errors per prompt (Fu et al. 2024, eq. 10): cos(E_a, E_b) -> (A, K, B)."""
    return cosine_matrix(residuals(preds_a, ys, include_first), residuals(preds_b, ys, include_first))


def induced_weights(query_preds: Tensor, queries: Tensor) -> Tensor:
    """Least-squares weights fitted to a predictor's outputs on T fresh queries (Fu et al. 2024, eq. 11-12).

    query_preds (A, B, n, T), queries (B, T, d) -> (A, B, n, d): w = (X~^T X~)^{-1} X~^T Y~.
    """
    q = queries.double()
    pinv = torch.linalg.pinv(q)  # (B, d, T)
    return torch.einsum("bdt,abnt->abnd", pinv, query_preds.double())


def simw(weights_a: Tensor, weights_b: Tensor) -> Tensor:
    """Similarity of induced weights per prompt (Fu et al. 2024, SimW): mean over t = 1..n-1 of
    cos(w_t(a), w_t(b)); weights (A, B, n, d) and (K, B, n, d) -> (A, K, B)."""
    a = weights_a[:, :, 1:].double()
    b = weights_b[:, :, 1:].double()
    an = a / a.norm(dim=-1, keepdim=True).clamp_min(EPS)
    bn = b / b.norm(dim=-1, keepdim=True).clamp_min(EPS)
    return torch.einsum("abnd,kbnd->akb", an, bn) / a.shape[2]


def spd(query_preds_a: Tensor, query_preds_b: Tensor) -> Tensor:
    """Squared prediction difference (Akyurek et al. 2023, eq. 13) on fresh queries, averaged over prefixes
    t >= 1 and queries: (A, B, n, Q), (K, B, n, Q) -> (A, K, B)."""
    a = query_preds_a[:, :, 1:].double()
    b = query_preds_b[:, :, 1:].double()
    sq = (a * a).mean((-1, -2)).unsqueeze(1) + (b * b).mean((-1, -2)).unsqueeze(0)
    return sq - 2 * torch.einsum("abnq,kbnq->akb", a, b) / (a.shape[2] * a.shape[3])


def ilw(weights_a: Tensor, weights_b: Tensor) -> Tensor:
    """Implicit linear weight difference (Akyurek et al. 2023, eq. 15): mean over t >= 1 of ||w_a - w_b||^2."""
    a = weights_a[:, :, 1:].double()
    b = weights_b[:, :, 1:].double()
    sq = (a * a).sum(-1).mean(-1).unsqueeze(1) + (b * b).sum(-1).mean(-1).unsqueeze(0)
    return sq - 2 * torch.einsum("abnd,kbnd->akb", a, b) / a.shape[2]


def similarity_frame(
    values: Tensor,
    metric: str,
    a_name: str,
    b_name: str,
    b_grid: Sequence[dict[str, Any]],
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Tidy table of per-prompt similarities (A, K, B): one row per (a, k) with mean and a
    bootstrap 90% interval over prompts."""
    vals = values.permute(2, 0, 1)  # (B, A, K)
    lo, hi = bootstrap_mean(vals, n_boot=n_boot, seed=seed)
    mean = vals.mean(0)
    rows = []
    for a in range(values.shape[0]):
        for k, params in enumerate(b_grid):
            rows.append(
                {
                    "a": a_name,
                    "a_index": a,
                    "b": b_name,
                    "b_index": k,
                    **params,
                    "metric": metric,
                    "value": float(mean[a, k]),
                    "ci_low": float(lo[a, k]),
                    "ci_high": float(hi[a, k]),
                }
            )
    return pd.DataFrame(rows)


TIE_RTOL = 1e-9


def first_best(means: Tensor, rtol: float = TIE_RTOL) -> Tensor:
    """Index of the largest entry along the last axis, where entries within `rtol` (relative) of
    it tie and the first wins. On an iteration axis that is the fewest iterations reaching the
    best predictor: a learner that has converged (exact-line-search BFGS after d steps, Newton
    after ~10) repeats one predictor up to float round-off, and a plain argmax would pick
    whichever repetition the round-off favours."""
    top = means.max(-1, keepdim=True).values
    return (means >= top - rtol * top.abs()).to(torch.uint8).argmax(-1)


def best_match(
    values: Tensor, higher_is_better: bool = True, n_boot: int = 1000, seed: int = 0, level: float = 0.90
) -> pd.DataFrame:
    """Hyper-parameter matching (Fu et al. 2024, Def. 4): per index a, the grid index k maximising the
    mean similarity over prompts (minimising, for distances), with bootstrap intervals on both
    the best similarity and the argmax itself (prompts resampled). Ties up to float round-off
    go to the first grid index (`first_best`). The argmax on every resample, (n_boot, A), shared
    across a so that draws are paired, is kept in the frame's attrs["draws"]."""
    vals = values.double() if higher_is_better else -values.double()  # (A, K, B)
    n_a = vals.shape[0]
    best = first_best(vals.mean(-1))  # (A,)
    boot_means = resampled_means(vals.permute(2, 0, 1), n_boot, seed)  # (n_boot, A, K)
    boot_arg = first_best(boot_means).numpy()  # (n_boot, A)
    boot_best = boot_means.max(-1).values.numpy()
    sign = 1 if higher_is_better else -1
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    rows = []
    for a in range(n_a):
        k_lo, k_hi = np.percentile(boot_arg[:, a], q, method="nearest")
        s_lo, s_hi = sorted(sign * np.percentile(boot_best[:, a], q))
        rows.append(
            {
                "a_index": a,
                "best_index": int(best[a]),
                "similarity": float(sign * vals[a, best[a]].mean()),
                "ci_low": float(s_lo),
                "ci_high": float(s_hi),
                "best_index_low": int(k_lo),
                "best_index_high": int(k_hi),
            }
        )
    frame = pd.DataFrame(rows)
    frame.attrs["draws"] = boot_arg
    return frame
