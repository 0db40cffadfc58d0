"""Where things sit in a prompt of n examples: the token positions of x_i and y_i in the sequence
x_1, y_1, x_2, y_2, ... (length 2n), and which examples a prefix of t examples has seen."""

from __future__ import annotations

import torch
from torch import Tensor

X_TOKENS = slice(0, None, 2)  # x_1, x_2, ...: where the model's prediction of y_i is read
Y_TOKENS = slice(1, None, 2)  # y_1, y_2, ...


def x_positions(n_points: int) -> slice:
    """Token positions of x_1..x_n, where predictions are read."""
    return slice(0, 2 * n_points, 2)


def prefix_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """(n, n) bool, [t, i] = True where example i (0-based) is among the first t: i < t.
    Row t is what a learner predicting y_{t+1} may use."""
    idx = torch.arange(n, device=device)
    return idx.view(1, n) < idx.view(n, 1)


def keys_before(positions: Tensor, n_tokens: int) -> Tensor:
    """(R, n_tokens) bool, [r, j] = True where token j precedes positions[r]: the cached keys and
    values that a window resumed at positions[r] sees (`visible` of GPT2ICL.resume)."""
    return torch.arange(n_tokens, device=positions.device)[None, :] < positions[:, None]
