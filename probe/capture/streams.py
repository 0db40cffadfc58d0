"""Every layer's residual stream at every token, laid out by position for the probes, within the
memory budget (spilled to a memmap on disk above half the headroom)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..core.memory import MemoryBudget, nbytes
from .activations import RESID, capture, spill_dir

CHUNK_BYTES = 32 << 20  # one chunk's streams (its forward's temporaries are a few times that)
MIN_CHUNK = 8


def by_position_streams(
    model,
    xs: Tensor,
    ys: Tensor,
    device: str = "cpu",
    chunk: int | None = None,
    dtype: torch.dtype = torch.float32,
    memory: MemoryBudget | None = None,
) -> Tensor:
    """Every layer boundary's residual stream at every token, by position: (L+1, 2n, N, D).

    Captured `chunk` prompts at a time (default: as many as CHUNK_BYTES of streams hold, at least
    MIN_CHUNK; the forward is batch-invariant, so the numbers do not depend on it), each batch's
    streams written straight into that layout (`capture(by_position=True)`), so the probes never
    hold a second copy; above half the headroom of `memory` (`--max-memory` less what the process
    holds) the array is a memmap on disk (resid.npy in a spill directory). With dtype float64 the
    model runs in double precision (on a copy), so that the streams agree across machines' kernels
    to ~1e-15 rather than ~1e-7."""
    n_prompts, n = xs.shape[:2]
    shape = (model.n_layers + 1, 2 * n, n_prompts, model.d_model)
    np_dtype = np.dtype(np.float64 if dtype == torch.float64 else np.float32)
    if chunk is None:
        chunk = max(MIN_CHUNK, CHUNK_BYTES // max(1, nbytes(shape[:2] + shape[3:], np_dtype)))
    memory = memory or MemoryBudget()
    spill = nbytes(shape, np_dtype) > memory.headroom() // 2
    cap = capture(
        model,
        xs,
        ys,
        hooks=[RESID],
        batch_size=chunk,
        device=device,
        out_dir=spill_dir() if spill else None,
        max_bytes=1 << 62,  # the chunk is the batch; the array is on disk or not by the rule above
        double=dtype == torch.float64,
        by_position=True,
    )
    return torch.from_numpy(cap.acts[RESID])
