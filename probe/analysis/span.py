"""Span-of-examples test (Fu et al. 2024, App. B.4, eq. 41-42).

If a model runs a sum-of-moments method such as Iterative Newton, its induced weight vector
after t examples lies in span{x_1..x_t}. For each t we report the relative residual
||w - P_t w|| / ||w|| of the projection P_t onto that span, beside sqrt((d - t)/d), its value
for a random direction (0 once t >= d, when the span is all of R^d).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..core.threads import per_matrix
from ..data.positions import prefix_mask


def span_projectors(xs: torch.Tensor) -> torch.Tensor:
    """P_t = X_t^+ X_t, the projector onto span{x_1..x_t}, for every prefix: (B, n, d, d)."""
    x = xs.double()
    n = x.shape[1]
    mask = prefix_mask(n, x.device).to(x.dtype)  # (t, i): i < t
    xt = x.unsqueeze(1) * mask.view(1, n, n, 1)  # (B, t, n, d): first t rows kept
    return per_matrix(torch.linalg.pinv, xt) @ xt


def span_residuals(weights: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Relative residual of weights (A, B, n, d) outside the span of the prefix: (A, B, n)."""
    p = span_projectors(xs)
    w = weights.double()
    resid = w - torch.einsum("btij,abtj->abti", p, w)
    return resid.norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-12)


def span_table(weights: torch.Tensor, xs: torch.Tensor, label: str, index_name: str = "layer") -> pd.DataFrame:
    """Tidy rows (predictor, index, n_examples, residual, null) for t = 1..n-1.

    `residual` is the root mean square over prompts of the relative residual, the statistic
    whose value for a uniformly random direction is exactly sqrt((d - t)/d).
    """
    r = span_residuals(weights, xs)  # (A, B, n)
    d = xs.shape[-1]
    mean = r.pow(2).mean(1).sqrt().numpy()
    rows = []
    for a in range(r.shape[0]):
        for t in range(1, r.shape[2]):
            rows.append(
                {
                    "predictor": label,
                    index_name: a,
                    "n_examples": t,
                    "residual": float(mean[a, t]),
                    "random_null": float(np.sqrt(max(d - t, 0) / d)),
                }
            )
    return pd.DataFrame(rows)
