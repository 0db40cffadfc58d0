"""Linear layers whose every row's result is independent of how many rows share the call.

A report's numbers must not depend on the batch and chunk sizes its memory budget picks
(tests/test_memory_invariance.py). MKL's GEMM (torch's CPU BLAS) computes a call's last rows
with other kernels when their count is not a multiple of 4, and calls of fewer than 12 rows
entirely so (measured on torch 2.13's AVX-512 build: rows 4-6 of a 7-row float32 product, or
the last row of a 41-row (D, 1) read-out, differ from the same rows inside a larger call by
round-off). `stable_addmm` computes the rows up to the last multiple of 4 as they are (written in
place into the output) and pads the few rows after them with zeros to MIN_ROWS, so every real row
takes the main kernel, as it does in a large batch; only those tail rows are copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_ROWS = 16
ROW_MULTIPLE = 4


def padded_rows(m: int) -> int:
    """The row count a product of m rows is computed with."""
    return max(MIN_ROWS, -(-m // ROW_MULTIPLE) * ROW_MULTIPLE)


def stable_addmm(bias: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """bias + x @ weight for x (..., K) and weight (K, N), every row as a large batch computes it."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    if padded_rows(m) == m:
        return torch.addmm(bias, rows, weight).view(*x.shape[:-1], weight.shape[-1])
    main = m - m % ROW_MULTIPLE if m >= MIN_ROWS else 0  # rows that take the main kernel as they are
    tail = F.pad(rows[main:], (0, 0, 0, padded_rows(m - main) - (m - main)))
    if torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad):  # no out= under autograd
        parts = [torch.addmm(bias, rows[:main], weight)] if main else []
        parts.append(torch.addmm(bias, tail, weight)[: m - main])
        return torch.cat(parts).view(*x.shape[:-1], weight.shape[-1])
    out = torch.empty(m, weight.shape[-1], dtype=torch.result_type(rows, weight), device=rows.device)
    if main:
        torch.addmm(bias, rows[:main], weight, out=out[:main])
    out[main:] = torch.addmm(bias, tail, weight)[: m - main]
    return out.view(*x.shape[:-1], weight.shape[-1])


class StableLinear(nn.Linear):
    """nn.Linear (same parameters and state-dict keys) computed by `stable_addmm`."""

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias if self.bias is not None else x.new_zeros(self.out_features)
        return stable_addmm(bias, x, self.weight.t())
