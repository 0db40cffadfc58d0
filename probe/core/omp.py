"""OpenMP's wait policy, set once when icl-probe is imported (CLI and Python API alike), before torch
loads its OpenMP runtime.

Why: torch's CPU kernels run on an OpenMP thread pool whose idle threads spin (busy-wait) by
default between parallel regions. Beside other busy processes on a small machine the spinning
threads compete with the ones doing the work. `benchmarks/busy.py` (the default report on this
project's 2-core machine, 2026-11-27): with spinning waits 25.8 s (49 s of CPU) alone, 59.6 s
(78 s) beside one busy process, 147.7 s (146 s) beside two; with passive waits
(OMP_WAIT_POLICY=PASSIVE: idle threads sleep) 33.4 s (42 s) alone, 36.6 s (36 s) and 52.7 s
(38 s) beside them: CPU time beside busy processes 0.87x and 0.92x of the quiet run's, against
1.59x and 2.96x; every number of the report unchanged. The price is wall time on a quiet machine
(15-30% in repeated quiet runs: 30-32 s against 35-38 s), where a user may set
OMP_WAIT_POLICY=active. Nothing is changed where the user has set OMP_WAIT_POLICY, or where torch
was imported before icl-probe (its runtime has read the policy already). Batched LAPACK calls, where a
passive wait cost most (a wake-up per matrix), run on worker threads of one thread each instead
(probe/core/threads.py); a short spin before sleeping (libgomp's GOMP_SPINCOUNT) was measured and
not taken: `benchmarks/busy.py`, docs/guide/development.md.
"""

from __future__ import annotations

import os
import sys

POLICY = "PASSIVE"


def passive_waits() -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE for this process unless the user chose a policy or torch is already
    loaded; True if it was set."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = POLICY
    return True


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, lowered to the cgroup's CPU quota where
    one is set (cgroup v2 `cpu.max`, as containers set it), not the machine's count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as limit:
            quota, period = limit.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)
