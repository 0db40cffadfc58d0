"""Layer-by-layer views of a model: hidden states at the x tokens, and states for fresh queries.

Boundary l = 0..L follows probe.capture.hooks: 0 is the embedding output, l the raw residual
stream after block (or LSTM layer) l. Layer predictors are these states passed through a
retrained read-out (probe.analysis.readout).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..capture import RESID, capture


def x_states(model, xs: Tensor, ys: Tensor, device: str = "cpu", batch_size: int = 256,
             progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states at the x tokens (L+1, B, n, D) and the model's predictions (B, n)."""
    cap = capture(model, xs, ys, hooks=[RESID], positions="x", device=device, batch_size=batch_size,
                  progress=progress)
    return np.asarray(cap.acts[RESID]), cap.pred


def query_states(model, xs: Tensor, ys: Tensor, queries: Tensor, device: str = "cpu", batch_size: int = 512,
                 progress: bool = False, start: int = 0) -> np.ndarray:
    """States (L+1, B, n - start, Q, D) of query x~_q placed right after the first t examples,
    for t = start..n-1.

    For each prefix t the model sees x_1, y_1, ..., x_t, y_t, x~_q; causality makes this exactly
    the model's state when predicting for x~_q after t examples (seed 003 eq. 11).
    """
    b, n, d = xs.shape
    q = queries.shape[1]
    out = None
    from tqdm.auto import tqdm

    for t in tqdm(range(start, n), desc="query states", disable=not progress, leave=False):
        seq_x = torch.cat([xs[:, :t].unsqueeze(1).expand(b, q, t, d), queries.unsqueeze(2)], dim=2).reshape(b * q, t + 1, d)
        seq_y = torch.cat([ys[:, :t].unsqueeze(1).expand(b, q, t), torch.zeros(b, q, 1)], dim=2).reshape(b * q, t + 1)
        cap = capture(model, seq_x, seq_y, hooks=[RESID], positions=[2 * t], device=device, batch_size=batch_size)
        states = np.asarray(cap.acts[RESID])[:, :, 0]  # (L+1, B*Q, D)
        if out is None:
            out = np.empty((states.shape[0], b, n - start, q, states.shape[-1]), dtype=np.float32)
        out[:, :, t - start] = states.reshape(states.shape[0], b, q, -1)
    return out
