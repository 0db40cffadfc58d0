"""Planted Adam's one approximation (probe/models/constructions/adam.py, Hataya & Imaizumi 2024, Thm. 5): the step's normaliser
psi(t) = 1 / sqrt(t + eps) as a sum of ReLUs interpolating it at geometric knots, and the relative
error that interpolation makes."""

from __future__ import annotations

import math

import torch
from torch import Tensor

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # the adam learner's defaults (probe/learners/stochastic.py)
ADAM_PSI_RANGE = (1e-9, 1e4)  # knots of psi_k: 0, then geometric over this range of v / (1 - b2^k)
ADAM_PSI_RATIO = 1.25


def psi_knots() -> Tensor:
    """Knots of psi's interpolation in t = v / (1 - b2^k): 0, then geometric over ADAM_PSI_RANGE."""
    low, high = ADAM_PSI_RANGE
    count = math.ceil(math.log(high / low) / math.log(ADAM_PSI_RATIO)) + 1
    return torch.cat([torch.zeros(1), low * ADAM_PSI_RATIO ** torch.arange(count, dtype=torch.float64)])


def relu_segments(knots: Tensor, values: Tensor, t: Tensor) -> Tensor:
    """The piecewise-linear interpolant of `values` at increasing `knots`, constant beyond the last,
    as a sum of ReLUs that stays accurate in float32 (Def. 1): f(t) = f(t_N) + sum_j df_j
    (ReLU(-z_j) - ReLU(1 - z_j)), z_j = (t - t_j) / (t_{j+1} - t_j). Saturated segments above t
    contribute -df_j with |z_j| <= t_j / (t_{j+1} - t_j), and those below exactly 0."""
    z = (t.unsqueeze(-1) - knots[:-1]) / torch.diff(knots)
    return values[-1] + (torch.diff(values) * ((-z).relu() - (1 - z).relu())).sum(-1)


def psi(t: Tensor) -> Tensor:
    """psi(t) = 1 / sqrt(t + eps), the Adam step's normaliser at t = v / (1 - b2^k) (eq. 12)."""
    return 1.0 / (t + ADAM_EPS).sqrt()


def adam_psi_error() -> float:
    """Sup relative error of the ReLU interpolant of psi over [0, ADAM_PSI_RANGE[1]] (dense check)."""
    knots = psi_knots()
    t = torch.cat([knots, torch.sqrt(knots[2:] * knots[1:-1]), (knots[1:] + knots[:-1]) / 2]).sort().values
    t = torch.cat([t, (t[1:] + t[:-1]) / 2])
    return float(((relu_segments(knots, psi(knots), t) - psi(t)) / psi(t)).abs().max())
