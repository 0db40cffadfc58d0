"""xorshift32 (Marsaglia 2003, shifts 13, 17, 5) as a linear map over F_2: what the planted PRNG
construction (probe/models/constructions/prng.py, Hataya & Imaizumi 2024, Def. 2, Thm. 3) computes, and a plain reference."""

from __future__ import annotations

import torch
from torch import Tensor

PRNG_BITS = 32  # xorshift32's state


def xorshift32_matrix() -> Tensor:
    """A over F_2 of xorshift32 (s ^= s << 13; s ^= s >> 17; s ^= s << 5) on bit vectors, bit i = (s >> i) & 1."""
    cols = [xorshift32_step(1 << j) for j in range(PRNG_BITS)]
    return torch.tensor([[(c >> i) & 1 for c in cols] for i in range(PRNG_BITS)], dtype=torch.float64)


def xorshift32_step(s: int) -> int:
    """One step of Marsaglia's xorshift32, a plain reference."""
    s ^= (s << 13) & 0xFFFFFFFF
    s ^= s >> 17
    return s ^ ((s << 5) & 0xFFFFFFFF)
