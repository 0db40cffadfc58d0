"""The in-context error every analysis reports: squared error / d (Garg et al. 2022, Sec. 2), so
that predicting 0 for y = w . x with w, x ~ N(0, I_d) scores 1 whatever d is."""

from __future__ import annotations

from torch import Tensor


def error_per_dim(pred: Tensor, truth: Tensor | float, d: int) -> Tensor:
    """(pred - truth)^2 / d elementwise, in the inputs' dtype (callers average over prompts,
    positions or both)."""
    return (pred - truth) ** 2 / d
