"""k-nearest neighbours and averaging, Garg et al.'s baselines, on every prefix at once."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import LearnerResult, as_float64, linear_result
from .registry import register


def _knn_predict(points: Tensor, labels: Tensor, queries: Tensor, n_seen: Tensor, k: int, weighting: str) -> Tensor:
    """points (B, n, d), labels (B, n), queries (B, M, d), n_seen (M,) examples visible per query."""
    dist = torch.cdist(queries, points)  # (B, M, n)
    visible = torch.arange(points.shape[1], device=points.device) < n_seen.unsqueeze(-1)  # (M, n)
    dist = dist.masked_fill(~visible, float("inf"))
    kk = min(k, points.shape[1])
    nd, idx = dist.topk(kk, dim=-1, largest=False)  # (B, M, kk)
    valid = torch.isfinite(nd)
    y = torch.gather(labels.unsqueeze(1).expand(-1, queries.shape[1], -1), 2, idx)
    if weighting == "uniform":
        w = valid.to(y.dtype)
    else:  # scikit-learn's "distance": 1/d, and an exact match takes all the weight
        exact = (nd == 0) & valid
        w = torch.where(
            exact.any(-1, keepdim=True), exact.to(y.dtype), torch.where(valid, 1 / nd.clamp_min(1e-300), 0.0)
        )
    total = w.sum(-1)
    return torch.where(total > 0, (w * y).sum(-1) / total.clamp_min(1e-300), torch.zeros_like(total))


@register("knn", label="k-NN")
def knn(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    k: Sequence[int] = (3,),
    weighting: Sequence[str] = ("uniform",),
) -> LearnerResult:
    """Mean label of the k nearest prefix examples (all of them while t < k; 0 at t = 0)."""
    xs, ys, queries = as_float64(xs, ys, queries)
    n = xs.shape[1]
    grid, preds, qpreds = [], [], []
    for kk in k:
        for wt in weighting:
            grid.append({"k": int(kk), "weighting": wt})
            preds.append(_knn_predict(xs, ys, xs, torch.arange(n, device=xs.device), int(kk), wt))
            if queries is not None:
                qpreds.append(
                    torch.stack(
                        [
                            _knn_predict(
                                xs, ys, queries, torch.full((queries.shape[1],), t, device=xs.device), int(kk), wt
                            )
                            for t in range(n)
                        ],
                        dim=1,
                    )
                )  # (B, n, Q)
    return LearnerResult("knn", grid, torch.stack(preds), None, torch.stack(qpreds) if qpreds else None)


@register("averaging", label="averaging")
def averaging(xs: Tensor, ys: Tensor, queries: Tensor | None = None) -> LearnerResult:
    """w_t = (1/t) sum_{i<=t} y_i x_i (Garg et al.'s averaging estimator; 0 at t = 0)."""
    xs, ys, queries = as_float64(xs, ys, queries)
    prod = xs * ys.unsqueeze(-1)
    counts = torch.arange(xs.shape[1], device=xs.device, dtype=xs.dtype).clamp_min(1).view(1, -1, 1)
    w = (torch.cumsum(prod, dim=1) - prod) / counts
    return linear_result("averaging", [{}], w[None], xs, queries)
