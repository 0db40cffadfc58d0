"""A random number from the data (`planted="uniform"`, eps = planted_scale; Hataya & Imaizumi 2024, Thm. 2, eq. 8, 17).

One block, two ReLU-attention heads. In run t the last example's first coordinate z_t is held
out (moved into the query token, folded into the embedding) and the first t - 1 examples are the
keys: u = 1/(t-1) sum_{i<t} [ReLU(a (z_t - z_i) + 1/2) - ReLU(a (z_t - z_i) - 1/2)],
a = 1/(4 eps): the empirical CDF of z_1..z_{t-1} at z_t, each step a ramp of width 4 eps. Over
prompts u is close to U(0, 1) (KS distance <= eps + O(1/sqrt t)); it depends on which example is
last, so on the order of the examples.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...core.errors import ConfigError
from .base import Construction, PlantOptions, construction, require_one_block, select

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..planted import PlantedICL


@construction
class Uniform(Construction):
    name = "uniform"
    title = "a uniform random number from the data (Hataya & Imaizumi 2024, Thm. 2)"
    heads = 2
    relu_attention = True

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        return [("x", cfg.n_dims), ("one", 1), ("qone", 1), ("z", 1), ("u", 1)]

    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Run t: examples 0..t-2 are the keys, example t-1's first coordinate sits in the query;
        divisor t - 1."""
        n, s = xs.shape[1], model.layout
        keys = xs.new_ones(n, n).tril(-2).view(1, n, n, 1)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * keys
        h[:, :, :n, s["one"]] = keys.expand(h.shape[0], n, n, 1)
        run = torch.arange(n, device=xs.device)
        last = (run - 1).clamp(min=0)  # run t holds out example t-1 (0-based)
        h[:, :, -1, s["z"]] = xs[:, last, :1] * (run > 0).to(xs.dtype).view(1, n, 1)
        h[:, :, -1, s["qone"]] = 1.0
        return h, last.to(xs.dtype)

    def plant(self, model: PlantedICL) -> None:
        """Eq. 17: the held-out coordinate's empirical CDF."""
        s, a = model.layout, 1.0 / (4 * model.config.planted_scale)
        for head, (offset, sign) in enumerate(((0.5, 1.0), (-0.5, -1.0))):
            q = select(s, "one", "z", a) + select(s, "z", "qone")  # [a z, 1]
            k = select(s, "one", "one") + offset * select(s, "z", "one")  # [1, offset - a x_1]
            k[s["z"].start, s["x"].start] = -a
            model.q[0, head], model.k[0, head] = q, k
            model.v[0, head] = select(s, "u", "one", sign)
            model.per_example[0, head] = 1  # 1 / (t - 1): the keys
        model.read[s["u"]] = 1.0

    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        require_one_block(self.name, layers, "Thm. 2")
        if not math.isfinite(options.eps) or options.eps <= 0:
            raise ConfigError(
                f"--eps must be a number > 0 (the ramp half-width of the empirical CDF), got {options.eps}"
            )
        return {"n_head": 1, "planted_scale": float(options.eps)}
