"""Batched LAPACK calls split over threads, each on one thread: torch's CPU `eigh`, `pinv`, Cholesky
factorisations and solves of a batch of matrices (the learners' d x d moments, the span test's
t x d prefixes, the probes' ridge heads and Hessians) go through LAPACK one matrix at a time, with
the GIL released.

Why one thread each: with LAPACK's own threads every call of a batched operation opens OpenMP
parallel regions per matrix, and with passive waits (probe/core/omp.py) each region wakes a
sleeping thread. Measured on this project's 2-core machine with passive waits (batch x side,
batched on two threads against split over two threads of one): eigh 144 x 64 104 -> 34 ms,
144 x 128 998 -> 95 ms, 48 x 256 1109 -> 158 ms, 8 x 512 678 -> 174 ms; cholesky_solve 144 x 64
18.3 -> 2.3 ms; with spinning waits the split is still as fast or faster (eigh 144 x 128 169 -> 89 ms).
The result is also the same on every machine: each matrix goes through the single-threaded LAPACK
call, whatever the thread count (LAPACK's threaded eigh differs from its serial one in round-off
from a side of 64 up)."""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

Result = TypeVar("Result", Tensor, Any)
_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (process id, threads) -> workers of one OpenMP thread


def _torch_openmp():
    """torch's own OpenMP runtime (the libgomp its wheels bundle), or None where it has none there."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    try:
        return ctypes.CDLL(path) if os.path.exists(path) else None
    except OSError:
        return None


def _one_thread(openmp) -> None:
    openmp.omp_set_num_threads(1)  # this thread's own OpenMP setting, which MKL's LAPACK follows


def _workers(threads: int) -> ThreadPoolExecutor | None:
    """`threads` worker threads whose torch runs on one thread, kept for the process (a forked child
    makes its own: threads do not survive a fork); None where torch's OpenMP runtime is not found.
    Each worker sets its own thread's OpenMP count, not torch.set_num_threads: that one also sets
    torch's count for every thread, and once any thread has called it, with more than one thread,
    MKL's batched LU of systems from 257 x 257 on goes wrong (torch 2.13's CPU build:
    `torch.linalg.solve_ex` returns wrong solutions or raises "Pivots given to lu_solve must all be
    greater or equal to 1"; tests/test_learners.py)."""
    key = (os.getpid(), threads)
    if key not in _POOLS:
        openmp = _torch_openmp()
        if openmp is None:
            return None
        _POOLS[key] = ThreadPoolExecutor(threads, "icl-probe-lapack", initializer=_one_thread, initargs=(openmp,))
    return _POOLS[key]


def per_matrix(fn: Callable[..., Result], *xs: Tensor) -> Result:
    """fn(*xs) for a function of batches of matrices xs (..., m, k), all of one batch shape, that
    treats each matrix on its own (eigh, pinv, cholesky_ex, cholesky_solve, solve_triangular): on
    CPU the batch is cut into torch.get_num_threads() parts, each run on a worker thread whose
    OpenMP (and so MKL's LAPACK) has one thread. The result is fn(*xs) in a one-thread process, bit
    for bit, whatever the thread count (tested); off the CPU, on one thread, or where torch's OpenMP
    runtime is not found (`_torch_openmp`), it is fn(*xs) on the calling thread."""
    threads = torch.get_num_threads()
    batch = xs[0].shape[:-2]
    count = math.prod(batch)
    workers = _workers(threads) if xs[0].device.type == "cpu" and threads >= 2 and count >= 2 else None
    if workers is None:
        return fn(*xs)
    flat = [x.reshape(-1, *x.shape[-2:]) for x in xs]
    parts = list(workers.map(fn, *(x.chunk(threads) for x in flat)))
    if isinstance(parts[0], Tensor):
        out = torch.cat(parts)
        return cast(Result, out.view(*batch, *out.shape[1:]))
    return cast(Result, tuple(torch.cat(p).view(*batch, *p[0].shape[1:]) for p in zip(*parts)))
