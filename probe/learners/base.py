"""The shape every reference learner returns, and the prefix statistics they share.

Convention: prompts xs (B, n, d), ys (B, n). "Prefix t" (t = 0..n-1) is the first t examples;
the learner's prediction at prefix t is for x_{t+1} (0-based: xs[:, t]), having seen
(x_1, y_1)..(x_t, y_t). A learner with a hyper-parameter grid of K settings returns K results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError


@dataclass
class LearnerResult:
    name: str
    grid: list[dict[str, Any]]  # K hyper-parameter settings, in order
    preds: Tensor  # (K, B, n): prediction for x_{t+1} after t examples
    weights: Tensor | None = None  # (K, B, n, d): weight vector held after t examples (linear learners)
    query_preds: Tensor | None = None  # (K, B, n, Q): predictions for extra queries after t examples


def check_prompts(xs: Tensor, ys: Tensor, queries: Tensor | None = None) -> None:
    if xs.ndim != 3:
        raise ConfigError(f"xs must have shape (batch, points, d), got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ConfigError(f"ys must have shape {tuple(xs.shape[:2])} to match xs, got {tuple(ys.shape)}")
    if queries is not None and (
        queries.ndim != 3 or queries.shape[0] != xs.shape[0] or queries.shape[2] != xs.shape[2]
    ):
        raise ConfigError(
            f"queries must have shape (batch={xs.shape[0]}, Q, d={xs.shape[2]}), got {tuple(queries.shape)}"
        )


def prefix_moments(xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
    """S_t = sum_{i<=t} x_i x_i^T and b_t = X_t^T y_t for every prefix t = 0..n-1 (exclusive sums).

    Returns S (B, n, d, d) and b (B, n, d); S[:, 0] = 0 (no example seen).
    """
    outer = xs.unsqueeze(-1) * xs.unsqueeze(-2)  # (B, n, d, d)
    s = torch.cumsum(outer, dim=1) - outer  # exclusive: examples before position t
    b = torch.cumsum(xs * ys.unsqueeze(-1), dim=1) - xs * ys.unsqueeze(-1)
    return s, b


def linear_result(
    name: str, grid: list[dict[str, Any]], weights: Tensor, xs: Tensor, queries: Tensor | None
) -> LearnerResult:
    """Predictions of linear learners from their weights (K, B, n, d)."""
    preds = torch.einsum("kbnd,bnd->kbn", weights, xs)
    query_preds = None if queries is None else torch.einsum("kbnd,bqd->kbnq", weights, queries)
    return LearnerResult(name, grid, preds, weights, query_preds)


def as_float64(xs: Tensor, ys: Tensor, queries: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Prompts (and optional queries) in float64, the precision every learner computes in."""
    return xs.to(torch.float64), ys.to(torch.float64), None if queries is None else queries.to(torch.float64)
