"""What every in-context regression model returns when run on prompts."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ModelOutput:
    pred: Tensor  # (B, n): prediction for y_i read at the x_i token
    resid: list[Tensor]  # L+1 tensors (B, 2n, D): embedding output, then the raw stream after each layer
    final: Tensor  # (B, 2n, D): the stream the read-out sees (after ln_f for GPT-2; = resid[-1] for LSTM)
