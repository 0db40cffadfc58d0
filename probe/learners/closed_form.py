"""Least squares and ridge regression on every prefix at once (seed 003 eq. 5, seed 002 eq. 17-18)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.threads import per_matrix
from .base import LearnerResult, as_float64, at_prefixes, linear_result, prefix_moments
from .registry import register


def least_squares_weights(xs: Tensor, ys: Tensor, rtol: float = 1e-10, last_prefix: bool = False) -> Tensor:
    """Minimum-norm w_t = S_t^+ X_t^T y_t for every prefix (B, n, d), or the last (B, 1, d) (seed 003 eq. 5)."""
    s, b = prefix_moments(xs, ys, last_prefix)
    pinv = per_matrix(lambda m: torch.linalg.pinv(m, hermitian=True, rtol=rtol), s)
    return (pinv @ b.unsqueeze(-1)).squeeze(-1)


@register("least_squares", label="least squares")
def least_squares(xs: Tensor, ys: Tensor, queries: Tensor | None = None, last_prefix: bool = False) -> LearnerResult:
    """OLS with the pseudo-inverse: the minimum-norm interpolant while t < d."""
    xs, ys, queries = as_float64(xs, ys, queries)
    weights = least_squares_weights(xs, ys, last_prefix=last_prefix)[None]
    return linear_result("least_squares", [{}], weights, at_prefixes(xs, last_prefix), queries)


@register("ridge", label="ridge")
def ridge(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    lam: Sequence[float] = (0.01, 0.1, 1.0),
) -> LearnerResult:
    """w_t = (S_t + lambda I)^{-1} X_t^T y_t, minimising ||y - X w||^2 + lambda ||w||^2.

    The Bayes-optimal choice for y = x.w + N(0, sigma^2), w ~ N(0, tau^2 I) is
    lambda = sigma^2 / tau^2 (seed 002 eq. 18); see `bayes_lambda`.
    """
    xs, ys, queries = as_float64(xs, ys, queries)
    s, b = prefix_moments(xs, ys, last_prefix)
    eye = torch.eye(xs.shape[-1], dtype=xs.dtype, device=xs.device)
    if any(v <= 0 for v in lam):  # checked on the host values: no device sync
        raise ConfigError(f"ridge lambdas must be > 0 (use least_squares for 0), got {list(lam)}")
    lams = torch.as_tensor(list(lam), dtype=xs.dtype, device=xs.device)
    reg = s.unsqueeze(0) + lams.view(-1, 1, 1, 1, 1) * eye  # (K, B, n, d, d)
    try:
        w = torch.linalg.solve(reg, b.unsqueeze(0).expand(len(lams), *b.shape).unsqueeze(-1)).squeeze(-1)
    except torch.linalg.LinAlgError:  # singular: lambda vanishes beside S in float64 (below d examples)
        top = float(s.diagonal(dim1=-2, dim2=-1).abs().max())
        raise ConfigError(
            f"ridge with lambda {min(lam):g} is singular on these prompts: S = X^T X reaches {top:.3g}, where "
            f"{min(lam):g} is below {xs.dtype}'s resolution; rescale the prompts or use lambdas comparable to |x|^2"
        ) from None
    return linear_result("ridge", [{"lam": float(v)} for v in lam], w, at_prefixes(xs, last_prefix), queries)


def bayes_lambda(noise_std: float, w_scale: float) -> float:
    """sigma^2 / tau^2, the ridge penalty whose estimate is the posterior mean (seed 002 eq. 18)."""
    return noise_std**2 / w_scale**2
