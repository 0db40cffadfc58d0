"""Adam (`planted="adam"`, eta = planted_scale, K = planted_batch; Hataya & Imaizumi 2024, Thm. 5, eq. 12-15 with
beta1 = 0.9, beta2 = 0.999 and eps = 1e-8 inside the root as printed).

The SGD construction's tokens (probe/models/constructions/sgd.py) plus the Adam state in the
query token [flag, G, m, v, P, u] (every example token holds 0 there). Four layers per step k:
(A) the query gathers G = 1/|B_t| sum_i g_i x_i = -gradient (one linear head, keys read g);
(B) d heads of the query with itself give G_c^2 exactly (a product of one token's entries is a
bilinear form), the skip map makes m <- b1 m - (1-b1) G and v <- b2 v + (1-b2) G^2 and clears
G, and the MLP writes P = psi_k(v) = 1 / sqrt(v / (1 - b2^k) + eps), a sum of ReLUs
interpolating psi_k at geometric knots (the only approximation: relative accuracy
`adam_psi_error()` in probe/models/adam_psi.py, about 5e-3); (C) d heads give
u_c = m_c P_c / (1 - b1^k) exactly; (D) every token attends to the query:
r_j <- r_j + eta u.x_j (so the residuals hold y - w_k.x and -r_q = w_k.x_q), and the MLP writes
the next step's gates as in SGD. Boundary 4k holds step k.

Deviations: four layers per step instead of Thm. 5's two, because the squares and the products
m_c P_c are computed exactly by attention and only psi is approximated (1-D, so its accuracy can
be stated); the first gate is folded into the embedding as for SGD. Eq. 16's bound is then
checked with eps = the step map's error (tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...core.errors import ConfigError
from ..adam_psi import ADAM_BETAS, psi, psi_knots
from .base import PlantOptions, construction, select
from .sgd import SGD, gate_mlp

if TYPE_CHECKING:
    from ...core.settings import SweepSettings
    from ..config import ModelConfig
    from ..planted import PlantedICL

ADAM_STEP = 0.1  # default eta


@construction
class Adam(SGD):
    name = "adam"
    title = "Adam with seeded masks (Hataya & Imaizumi 2024, Thm. 5)"
    learner = "adam"
    first, per_step = 0, 4
    matching_sweep = "adam_replay"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        return super().slots(cfg) + [("flag", 1), ("G", d), ("m", d), ("v", d), ("P", d), ("u", d)]

    def n_heads(self, cfg: ModelConfig) -> int:
        return cfg.n_dims

    def d_mlp(self, cfg: ModelConfig) -> int:
        return 2 * cfg.n_dims * (len(psi_knots()) - 1)

    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """SGD's tokens; the query token's flag marks where the optimizer state lives."""
        h, t = super().tokens(model, h, xs, ys)
        h[:, :, -1, model.layout["flag"]] = 1.0
        return h, t

    def plant(self, model: PlantedICL) -> None:
        """Layers (A) gradient, (B) moments and psi, (C) the step direction, (D) the update and the next gates."""
        cfg, s, d = model.config, model.layout, model.config.n_dims
        (b1, b2), steps = ADAM_BETAS, self.mask_steps(cfg)
        self.plant_masks(model)
        knots = psi_knots()
        values, width = psi(knots), torch.diff(knots)
        for k in range(1, steps + 1):
            a_, b_, c_, d_ = (self.per_step * (k - 1) + i for i in range(4))
            model.q[a_, 0], model.k[a_, 0] = select(s, "g", "flag"), select(s, "g", "g")  # (A) G = mean g_i x_i
            model.v[a_, 0], model.per_example[a_, 0] = select(s, "G", "x"), 1
            model.skip[a_] = -select(s, "g", "g")
            for coord in range(d):  # (B) (1 - b2) G_c^2 into v_c: the query with itself
                model.q[b_, coord, s["G"].start + coord, s["G"].start + coord] = 1.0
                model.k[b_, coord, s["G"].start + coord, s["G"].start + coord] = 1.0
                model.v[b_, coord, s["v"].start + coord, s["flag"].start] = 1 - b2
            model.skip[b_] = (
                (b1 - 1) * select(s, "m", "m") - (1 - b1) * select(s, "m", "G") + (b2 - 1) * select(s, "v", "v")
            ) - select(s, "G", "G")
            scale = 1 - b2**k  # P_c = psi(v_c / (1 - b2^k)) by relu_segments: z_j = (v / scale - t_j) / dt_j
            segments = len(width)
            for coord in range(d):
                low, high = (
                    slice(2 * segments * coord, 2 * segments * coord + segments),
                    slice(2 * segments * coord + segments, 2 * segments * (coord + 1)),
                )
                for units, offset, sign in ((low, 0.0, 1.0), (high, 1.0, -1.0)):  # ReLU(-z), ReLU(1 - z)
                    model.mlp_in[b_, units, s["v"].start + coord] = (-1 / (scale * width)).float()
                    model.mlp_in[b_, units, s["flag"].start] = (offset + knots[:-1] / width).float()
                    model.mlp_out[b_, s["P"].start + coord, units] = (sign * torch.diff(values)).float()
                model.skip[b_, s["P"].start + coord, s["flag"].start] += float(values[-1])
            for coord in range(d):  # (C) u_c = m_c P_c / (1 - b1^k)
                model.q[c_, coord, s["m"].start + coord, s["m"].start + coord] = 1.0
                model.k[c_, coord, s["m"].start + coord, s["flag"].start] = 1.0
                model.v[c_, coord, s["u"].start + coord, s["P"].start + coord] = 1 / (1 - b1**k)
            model.skip[c_] = -select(s, "P", "P")
            model.q[d_, 0] = select(s, "u", "x") + select(s, "u", "xq")  # (D) r_j += eta u.x_j
            model.k[d_, 0] = select(s, "u", "u")
            model.v[d_, 0] = select(s, "r", "flag", cfg.planted_scale)
            model.skip[d_] = -select(s, "u", "u")
            if k < steps:
                gate_mlp(model, d_, s["b"].start + k)
        model.read[s["r"]] = -1.0

    def step_size(self, layers: int, d: int, options: PlantOptions) -> float:
        step = ADAM_STEP if options.step_size is None else options.step_size
        if not 0 < step <= 1:
            raise ConfigError(f"--step-size must lie in (0, 1] for Adam (each step moves w by about eta), got {step}")
        if layers % self.per_step:
            raise ConfigError(f"a planted adam model has {self.per_step} layers per step; use --layers 4, 8, 12, ...")
        return float(step)

    def adapt_sweeps(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        self.add_replays(sweeps, cfg)
