"""Online learners that see one example at a time: online GD and recursive least squares."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.validate import Rule
from .base import LearnerResult, as_float64, linear_result
from .registry import register


@register("ogd", label="online GD", rules={"eta": Rule("number", names=("normalized",))})
def ogd(
    xs: Tensor, ys: Tensor, queries: Tensor | None = None, *, eta: Sequence[float | str] = ("normalized",)
) -> LearnerResult:
    """Online gradient descent (Fu et al. 2024, eq. 7): w_{k+1} = w_k - eta_k (w_k.x_k - y_k) x_k, w_0 = 0.

    eta "normalized" is eta_k = 1/||x_k||^2, which makes w_{k+1} fit (x_k, y_k) exactly.
    """
    xs, ys, queries = as_float64(xs, ys, queries)
    b, n, d = xs.shape
    grid, weights = [], []
    for e in eta:
        if e == "normalized":
            rate = 1.0 / (xs**2).sum(-1).clamp_min(1e-300)  # (B, n)
        else:  # a positive number (the learner's rules)
            rate = torch.full((b, n), float(e), dtype=xs.dtype, device=xs.device)
        w = xs.new_zeros(b, d)
        held = [w]
        for k in range(n - 1):
            resid = (w * xs[:, k]).sum(-1) - ys[:, k]  # (B,)
            w = w - (rate[:, k] * resid).unsqueeze(-1) * xs[:, k]
            held.append(w)
        weights.append(torch.stack(held, dim=1))  # (B, n, d): weights before seeing example t
        grid.append({"eta": e})
    return linear_result("ogd", grid, torch.stack(weights), xs, queries)


@register("online_least_squares", label="online least squares")
def online_least_squares(
    xs: Tensor, ys: Tensor, queries: Tensor | None = None, *, lam: Sequence[float] = (1e-4,)
) -> LearnerResult:
    """Recursive least squares by Sherman-Morrison updates (Akyurek et al. 2023, §3.3).

    P_0 = I/lambda, w_0 = 0;  P_{k+1} = P_k - P_k x x^T P_k / (1 + x^T P_k x),
    w_{k+1} = w_k + P_{k+1} x (y - x.w_k). Equals ridge with penalty lambda on every prefix.
    """
    xs, ys, queries = as_float64(xs, ys, queries)
    b, n, d = xs.shape
    grid, weights = [], []
    for value in lam:
        p = torch.eye(d, dtype=xs.dtype, device=xs.device).expand(b, d, d) / value
        w = xs.new_zeros(b, d)
        held = [w]
        for k in range(n - 1):
            x = xs[:, k]
            px = (p @ x.unsqueeze(-1)).squeeze(-1)  # (B, d)
            p = p - px.unsqueeze(-1) * px.unsqueeze(-2) / (1 + (x * px).sum(-1)).view(b, 1, 1)
            w = w + (p @ x.unsqueeze(-1)).squeeze(-1) * (ys[:, k] - (x * w).sum(-1)).unsqueeze(-1)
            held.append(w)
        weights.append(torch.stack(held, dim=1))
        grid.append({"lam": float(value)})
    return linear_result("online_least_squares", grid, torch.stack(weights), xs, queries)
