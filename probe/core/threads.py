"""Batched LAPACK calls split over threads, each on one thread: torch's CPU `eigh`, `pinv`, Cholesky
factorisations and solves of a batch of matrices (the learners' d x d moments, the span test's
t x d prefixes, the probes' ridge heads and Hessians) go through LAPACK one matrix at a time, and
LAPACK releases the GIL.

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

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

Result = TypeVar("Result", Tensor, Any)
_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (process id, threads) -> workers of one torch thread


def _one_thread(started: threading.Barrier) -> None:
    torch.get_num_threads()  # torch's lazy set-up of this thread, which would take the default later
    torch.set_num_threads(1)  # this worker's own OpenMP and MKL setting (and torch's default for new threads)
    started.wait()


def _workers(threads: int) -> ThreadPoolExecutor:
    """`threads` worker threads, each running torch on one thread, kept for the process (a forked
    child makes its own: threads do not survive a fork). Every worker is started here, and then
    torch's default for threads started later is set back to the caller's count (a worker's
    torch.set_num_threads(1) sets it too)."""
    key = (os.getpid(), threads)
    if key not in _POOLS:
        started = threading.Barrier(threads + 1)
        pool = ThreadPoolExecutor(threads, "icl-probe-lapack", initializer=_one_thread, initargs=(started,))
        for _ in range(threads):
            pool.submit(int)  # each submit starts a worker, which waits at the barrier until all have
        started.wait()
        torch.set_num_threads(threads)
        _POOLS[key] = pool
    return _POOLS[key]


def per_matrix(fn: Callable[..., Result], *xs: Tensor) -> Result:
    """fn(*xs) for a function of batches of matrices xs (..., m, k), all of one batch shape, that
    treats each matrix on its own (eigh, pinv, cholesky_ex, cholesky_solve, solve_triangular): on
    CPU the batch is cut into torch.get_num_threads() parts, each run on a worker thread with torch
    on one thread. The result is fn(*xs) run on one thread, bit for bit, whatever the thread count
    (tested); off the CPU, or on one thread, it is fn(*xs)."""
    threads = torch.get_num_threads()
    batch = xs[0].shape[:-2]
    count = math.prod(batch)
    if xs[0].device.type != "cpu" or threads < 2 or count < 2:
        return fn(*xs)
    flat = [x.reshape(-1, *x.shape[-2:]) for x in xs]
    parts = list(_workers(threads).map(lambda chunk: fn(*chunk), zip(*(x.chunk(threads) for x in flat))))
    if isinstance(parts[0], Tensor):
        out = torch.cat(parts)
        return cast(Result, out.view(*batch, *out.shape[1:]))
    return cast(Result, tuple(torch.cat(p).view(*batch, *p[0].shape[1:]) for p in zip(*parts)))
