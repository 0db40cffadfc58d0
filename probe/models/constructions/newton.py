"""Iterative Newton with linear attention (`planted="newton"`, alpha = planted_scale).

Iterative Newton (Fu et al. 2024, eq. 8) on the normalised moment S/t with a fixed M_0 = alpha S/t,
using d extra "column" tokens that carry the columns m_j of M_k (hidden size O(d), as Fu et al. 2024
Thm. 1; linear instead of ReLU attention). Layer 1: m_j = alpha/t sum_i x_i <x_i, e_j>, and the
query gathers b = 1/t sum_i y_i x_i. Then two layers per iteration: (A) u_j = S m_j / t (columns
attend to examples) and z = M_k x_q (query attends to columns); (B) m_j <- 2 m_j - M_k u_j
(columns attend to columns) and p = 1/t sum_i y_i <x_i, z> = x_q . M_k b (query attends to
examples). Read-out: p. Layer map: boundaries 0-2 predict 0; boundary l >= 3 holds iteration
(l - 3) // 2. Matching learner: newton with alpha = planted_scale (a number: fixed scale on S/t).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...core.errors import ConfigError
from ..learner_state import LearnerState
from .base import Construction, PlantOptions, construction, select

if TYPE_CHECKING:
    from ...core.settings import SweepSettings
    from ..config import ModelConfig
    from ..planted import PlantedICL


def newton_default_alpha(d: int) -> float:
    """A fixed alpha with alpha * lambda_max(S/t)^2 < 2 on all but ~1e-4 of short prefixes."""
    return 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2


class NewtonBase(Construction):
    """What the two Newton constructions share: their learner, its alpha, and their checks."""

    learner = "newton"
    unit = "iteration"
    matching_sweep = "newton"
    noun = "Newton"  # in messages: "a planted <noun> model"

    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        if layers < self.first:  # type: ignore[operator]
            raise ConfigError(
                f"a planted {self.noun} model needs at least {self.first} layers "
                f"(initialisation, then {self.per_step} per iteration)"
            )
        alpha = newton_default_alpha(d) if options.alpha is None else options.alpha
        limit = 2.0 / (1 + d**0.5) ** 4
        if not 0 < alpha < limit:
            raise ConfigError(
                f"--alpha {alpha} is unstable for d={d}: Newton needs 0 < alpha < 2/lambda_max(S/t)^2, "
                f"here about {limit:.5f}; try {newton_default_alpha(d):.5f}"
            )
        return {"n_head": 1, "planted_scale": float(alpha)}

    def adapt_sweeps(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        """Newton sweeps compare with the planted fixed alpha."""
        for sweep in sweeps:
            if sweep.learner == "newton":
                sweep.grid = {**sweep.grid, "alpha": [cfg.planted_scale]}


@construction
class Newton(NewtonBase):
    name = "newton"
    title = "Iterative Newton with linear attention"
    first, per_step = 3, 2
    heads = 2
    learner_state = LearnerState("newton", (("m", "e"),), first=1, every=2, lag=2)
    sibling = "newton-relu"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        names = ("x", "y", "xq", "one", "e", "m", "u", "b", "z", "p")
        return [(name, 1 if name in ("y", "one", "p") else d) for name in names]

    def extra_tokens(self, cfg: ModelConfig) -> int:
        return cfg.n_dims  # the column tokens

    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """The default tokens, then column token j holds e_j and the query a 1."""
        h, t = super().tokens(model, h, xs, ys)
        n, d, s = xs.shape[1], xs.shape[2], model.layout
        h[:, :, n : n + d, s["e"]] = torch.eye(d, dtype=xs.dtype, device=xs.device)
        h[:, :, -1, s["one"]] = 1.0
        return h, t

    def plant(self, model: PlantedICL) -> None:
        cfg, s = model.config, model.layout
        alpha = cfg.planted_scale
        # layer 0: M_0 = alpha S/t into the column tokens, b = X^T y / t into the query
        model.q[0, 0], model.k[0, 0], model.v[0, 0] = (
            select(s, "x", "e"),
            select(s, "x", "x"),
            select(s, "m", "x", alpha),
        )
        model.q[0, 1], model.k[0, 1], model.v[0, 1] = (
            select(s, "one", "one"),
            select(s, "one", "y"),
            select(s, "b", "x"),
        )
        model.per_example[0] = 1
        for l in range(1, cfg.n_layer):
            if l % 2 == 1:  # (A) u_j = S m_j / t; z = M x_q
                model.q[l, 0], model.k[l, 0], model.v[l, 0] = (
                    select(s, "x", "m"),
                    select(s, "x", "x"),
                    select(s, "u", "x"),
                )
                model.per_example[l, 0] = 1
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                    select(s, "e", "xq"),
                    select(s, "e", "e"),
                    select(s, "z", "m"),
                )
            else:  # (B) m_j <- 2 m_j - M u_j, clear u; p = b . M x_q via examples, clear z
                model.q[l, 0], model.k[l, 0] = select(s, "e", "u"), select(s, "e", "e")
                model.v[l, 0] = select(s, "m", "m", -1.0)
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                    select(s, "x", "z"),
                    select(s, "x", "x"),
                    select(s, "p", "y"),
                )
                model.per_example[l, 1] = 1
                model.skip[l] = select(s, "m", "m") - select(s, "u", "u") - select(s, "z", "z") - select(s, "p", "p")
        model.read[s["p"]] = 1.0
