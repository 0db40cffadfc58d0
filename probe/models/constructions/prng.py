"""A pseudo-random generator (`planted="prng"`, d = 32, M = n_head outputs; Hataya & Imaizumi 2024, Def. 2, Thm. 3).

xorshift32 (Marsaglia 2003, shifts 13, 17, 5) is s_t = A s_{t-1} over F_2 with o_t = s_t
(B = I). The seed s_0 is the first example's x read as 32 bits (0/1 entries). One block: head m
copies C_m s_0 into output slot o_m, C_m = A^m mod 2 (the query attends to the first example
only); the block's ReLU MLP reduces each count c in 0..32 mod 2 exactly,
c mod 2 = c + sum_j (-1)^j 2 ReLU(c - j). The read-out is o_1's first 24 bits as a number in [0, 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...core.errors import ConfigError
from ..xorshift import PRNG_BITS, xorshift32_matrix
from .base import Construction, PlantOptions, construction, require_one_block, select

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..planted import PlantedICL

PRNG_READ_BITS = 24  # bits of o_1 in the read-out (exact in float32)


@construction
class PRNG(Construction):
    name = "prng"
    title = "an xorshift32 pseudo-random generator (Hataya & Imaizumi 2024, Thm. 3)"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        return [("s", d), ("first", 1), ("qone", 1), ("o", cfg.n_head * d)]

    def n_heads(self, cfg: ModelConfig) -> int:
        return cfg.n_head  # one per output

    def d_mlp(self, cfg: ModelConfig) -> int:
        return cfg.n_head * cfg.n_dims**2

    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Run t >= 1 holds the seed x_1 in its first token; the query token a 1."""
        s = model.layout
        has_seed = (torch.arange(xs.shape[1], device=xs.device) > 0).to(xs.dtype).view(1, -1, 1)
        h[:, :, 0, s["s"]] = xs[:, :1] * has_seed
        h[:, :, 0, s["first"]] = has_seed
        h[:, :, -1, s["qone"]] = 1.0
        return h, xs.new_zeros(xs.shape[1])

    def plant(self, model: PlantedICL) -> None:
        """Head m emits A^m s_0, the MLP reduces mod 2."""
        s, k, m_out = model.layout, PRNG_BITS, model.config.n_head
        a, power = xorshift32_matrix(), torch.eye(PRNG_BITS, dtype=torch.float64)
        o = s["o"].start
        for m in range(m_out):
            power = (a @ power) % 2  # A^(m+1)
            model.q[0, m], model.k[0, m] = select(s, "first", "qone"), select(s, "first", "first")
            model.v[0, m, o + m * k : o + (m + 1) * k, s["s"]] = power.float()
        units = 0
        for bit in range(m_out * k):  # c mod 2 - c = sum_j (-1)^j 2 ReLU(c - j), exact on integers 0..k
            for j in range(1, k + 1):
                model.mlp_in[0, units, o + bit] = 1.0
                model.mlp_in[0, units, s["qone"]] = -float(j)
                model.mlp_out[0, o + bit, units] = 2.0 * (-1) ** j
                units += 1
        model.read[o : o + PRNG_READ_BITS] = 2.0 ** -torch.arange(1, PRNG_READ_BITS + 1, dtype=torch.float32)

    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        require_one_block(self.name, layers, "Thm. 3")
        if d != PRNG_BITS:
            raise ConfigError(
                f"a planted prng model reads its xorshift32 seed from x_1's {PRNG_BITS} bits; use --dims {PRNG_BITS}"
            )
        if options.outputs < 1:
            raise ConfigError(f"--outputs must be an integer >= 1, got {options.outputs}")
        return {"n_head": options.outputs}
