"""Token sequences for in-context regression: x_1, y_1, x_2, y_2, ... (length 2n).

Garg et al.: the x token is x itself and the y token is [y, 0, ..., 0] (both width d).
Akyurek et al. (Akyurek et al. 2023, §2): [0, x] and [y, 0, ..., 0] (both width d+1).
The model's prediction for y_i is read at the x_i token, i.e. positions 0, 2, 4, ...
"""

from __future__ import annotations

import torch
from torch import Tensor


def interleave(xs: Tensor, ys: Tensor, encoding: str = "garg") -> Tensor:
    """xs (B, n, d), ys (B, n) -> tokens (B, 2n, d) [garg] or (B, 2n, d+1) [akyurek]."""
    b, n, d = xs.shape
    if encoding == "garg":
        x_tok = xs
        y_tok = torch.cat([ys.unsqueeze(-1), xs.new_zeros(b, n, d - 1)], dim=-1)
    elif encoding == "akyurek":
        x_tok = torch.cat([xs.new_zeros(b, n, 1), xs], dim=-1)
        y_tok = torch.cat([ys.unsqueeze(-1), xs.new_zeros(b, n, d)], dim=-1)
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    return torch.stack([x_tok, y_tok], dim=2).reshape(b, 2 * n, x_tok.shape[-1])  # (B, 2n, width)
