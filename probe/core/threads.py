"""Batched LAPACK calls split over threads: torch's CPU `eigh` and `pinv` of a batch of small
matrices (the learners' d x d moments, the span test's t x d prefixes) run one matrix at a time on
one thread, and LAPACK releases the GIL (1280 x 41 pseudo-inverses at d = 20: 1.5 -> 1.0 s on two
threads; 256 x 256 eigendecompositions gain nothing, MKL already threads each). So only batches of
small matrices (at most SMALL rows and columns, which LAPACK runs on the calling thread) are split:
no thread pool runs on top of LAPACK's own threads."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

Result = TypeVar("Result", Tensor, Any)
SMALL = 64  # the largest matrix side split over threads (larger ones: LAPACK's own threads, if any)


def per_matrix(fn: Callable[[Tensor], Result], x: Tensor) -> Result:
    """fn(x) for a function of a batch of matrices x (..., m, k) that treats each matrix on its own
    (eigh, pinv): on CPU a batch of small matrices (sides <= SMALL) is cut into torch.get_num_threads()
    parts, one thread each; anything else is fn(x) on the calling thread. Each
    matrix goes through the same call as in fn(x), so the result is fn(x)'s bit for bit (tested)."""
    threads = torch.get_num_threads()
    batch = x.shape[:-2]
    small = max(x.shape[-2:]) <= SMALL
    if x.device.type != "cpu" or threads < 2 or not small or x[..., 0, 0].numel() < 2 * threads:
        return fn(x)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(fn, x.reshape(-1, *x.shape[-2:]).chunk(threads)))
    if isinstance(parts[0], Tensor):
        out = torch.cat(parts)
        return cast(Result, out.view(*batch, *out.shape[1:]))
    return cast(Result, tuple(torch.cat(p).view(*batch, *p[0].shape[1:]) for p in zip(*parts)))
