"""The shape every reference learner returns, and the prefix statistics they share.

Convention: prompts xs (B, n, d), ys (B, n). "Prefix t" (t = 0..n-1) is the first t examples;
the learner's prediction at prefix t is for x_{t+1} (0-based: xs[:, t]), having seen
(x_1, y_1)..(x_t, y_t). A learner with a hyper-parameter grid of K settings returns K results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError


class LearnerResult:
    """What a learner returns for K hyper-parameter settings (grid, in order): preds (K, B, n), the
    prediction for x_{t+1} after t examples; weights (K, B, n, d), the weight vector held after t
    examples (linear learners; None otherwise), formed on first read where the learner gives
    `weights_from` instead; query_preds (K, B, n, Q), predictions for extra queries after t examples."""

    def __init__(
        self,
        name: str,
        grid: list[dict[str, Any]],
        preds: Tensor,
        weights: Tensor | None = None,
        query_preds: Tensor | None = None,
        *,
        weights_from: Callable[[], Tensor] | None = None,
    ):
        self.name, self.grid, self.preds, self.query_preds = name, grid, preds, query_preds
        self._weights, self._weights_from = weights, weights_from

    @property
    def weights(self) -> Tensor | None:
        if self._weights is None and self._weights_from is not None:
            self._weights, self._weights_from = self._weights_from(), None
        return self._weights

    def __repr__(self) -> str:
        return f"LearnerResult({self.name!r}, {len(self.grid)} settings, preds {tuple(self.preds.shape)})"

    def last_prefix(self) -> LearnerResult:
        """The result at the last prefix alone: preds (K, B, 1), weights (K, B, 1, d), query_preds
        (K, B, 1, Q)."""
        weights, queries = self._weights, self.query_preds
        return LearnerResult(
            self.name,
            self.grid,
            self.preds[:, :, -1:],
            None if weights is None else weights[:, :, -1:],
            None if queries is None else queries[:, :, -1:],
            weights_from=None if self._weights_from is None else (lambda: self.weights[:, :, -1:]),  # type: ignore[index]
        )


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
    check_scale(xs, ys, queries)


def check_scale(xs: Tensor, ys: Tensor, queries: Tensor | None = None) -> None:
    """Refuse prompts whose magnitude overflows the learners' arithmetic in their dtype: the moments
    S = sum x x^T reach n |x|^2 and Newton's iteration multiplies them again, so beyond
    finfo.max^(1/4) / sqrt(n) an eigendecomposition or product overflows to inf (a raw LinAlgError
    from deep inside torch, or NaN predictions)."""
    if not xs.is_floating_point() or xs.numel() == 0:
        return
    scale = max(float(t.detach().abs().max()) for t in (xs, ys, queries) if t is not None and t.numel())
    limit = torch.finfo(xs.dtype).max ** 0.25 / max(xs.shape[1], 1) ** 0.5
    if scale > limit:
        raise ConfigError(
            f"prompts reach |value| {scale:.3g}, beyond what the learners can square in {xs.dtype} "
            f"({limit:.3g} for {xs.shape[1]} points); rescale the prompts"
            + ("" if xs.dtype == torch.float64 else " or pass them as float64")
        )


def prefix_moments(xs: Tensor, ys: Tensor, last_prefix: bool = False) -> tuple[Tensor, Tensor]:
    """S_t = sum_{i<=t} x_i x_i^T and b_t = X_t^T y_t for every prefix t = 0..n-1 (exclusive sums).

    Returns S (B, n, d, d) and b (B, n, d); S[:, 0] = 0 (no example seen). `last_prefix`: the last
    prefix's alone, (B, 1, d, d) and (B, 1, d), the same numbers.
    """
    outer = xs.unsqueeze(-1) * xs.unsqueeze(-2)  # (B, n, d, d)
    s = torch.cumsum(outer, dim=1) - outer  # exclusive: examples before position t
    b = torch.cumsum(xs * ys.unsqueeze(-1), dim=1) - xs * ys.unsqueeze(-1)
    return (s[:, -1:], b[:, -1:]) if last_prefix else (s, b)


def at_prefixes(xs: Tensor, last_prefix: bool) -> Tensor:
    """The x whose predictions a learner returns: every prefix's (B, n, d), or the last one's (B, 1, d)."""
    return xs[:, -1:] if last_prefix else xs


def spectral_result(
    name: str, grid: list[dict[str, Any]], basis: Tensor, coef: Tensor, xs: Tensor, queries: Tensor | None
) -> LearnerResult:
    """A linear learner given in each prefix's eigenbasis S_t = V_t diag(lam) V_t^T (GD, Iterative
    Newton), weights V_t coef: its predictions x^T V coef = (V^T x) . coef take K B n d products, so
    the weights (K, B, n, d) are formed only when read; query predictions, where asked for, from them."""
    rotated = (xs.unsqueeze(-2) @ basis).squeeze(-2)  # (B, n, d): x_t^T V_t
    result = LearnerResult(
        name, grid, (coef * rotated).sum(-1), weights_from=lambda: torch.einsum("bnij,kbnj->kbni", basis, coef)
    )
    if queries is not None:
        result.query_preds = torch.einsum("kbnd,bqd->kbnq", result.weights, queries)
    return result


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
