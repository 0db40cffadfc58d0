"""The memory budget: one object, made once from `--max-memory` and passed to capture, query
states and probes, which size their batches and chunks, and decide when to spill to disk, from
what it leaves beside what the process already holds."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable), or a conservative 4 GiB if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def resident_memory() -> int:
    """Bytes this process holds in memory now (resident set size; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def nbytes(shape, dtype=np.float32) -> int:
    """Bytes of an array of `shape` and `dtype`: the one byte formula of the budget's users."""
    return np.dtype(dtype).itemsize * math.prod(shape)


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes the whole process may hold: `limit` (`--max-memory`), or half the memory available
    when the budget is asked (None)."""

    limit: int | None = None
    floor: int = 64 << 20  # the least headroom any step is given

    def total(self) -> int:
        return self.limit if self.limit is not None else int(0.5 * available_memory())

    def headroom(self) -> int:
        """What the budget leaves beside what the process already holds (at least `floor`), so
        that the whole process, not each step alone, stays within it."""
        return max(self.floor, self.total() - resident_memory())
