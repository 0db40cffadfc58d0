"""The default report on a busy machine: CPU seconds and wall time of
`icl-probe report` (the shipped default checkpoint, quick recipe) alone and beside one and two
busy processes (each a Python loop on one core), with OpenMP's passive waits (icl-probe's default,
probe/core/omp.py) and with active ones (torch's default: idle threads spin), and whether every
number of the report is the same.

    .venv/bin/python benchmarks/busy.py            # about 6 minutes on this project's 2-core machine

Prints one line per run and the CPU ratio busy / alone per policy (the target: within 1.2x)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def run_report(out: Path, policy: str) -> tuple[float, float]:
    """(wall s, CPU s of the report process) of one quick report into `out`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    subprocess.run([sys.executable, "-m", "probe", "-q", "report", "--out", str(out), "--force", "--no-cache"],
                   env=env, check=True, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from test_shipped import _numbers_differ

    committed = json.loads((REPO / "reports" / "gpt2-default-quick" / "summary.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cpu: dict[tuple[str, int], float] = {}
        for policy in ("PASSIVE", "ACTIVE"):
            for busy in (0, 1, 2):
                spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
                try:
                    out = Path(tmp) / f"{policy}-{busy}"
                    wall, cpu[(policy, busy)] = run_report(out, policy)
                finally:
                    for p in spinners:
                        p.kill()
                same = not _numbers_differ(committed, json.loads((out / "summary.json").read_text()))
                print(f"policy={policy} busy={busy} wall_s={wall:.1f} cpu_s={cpu[(policy, busy)]:.1f} "
                      f"numbers_unchanged={same}", flush=True)
        for policy in ("PASSIVE", "ACTIVE"):
            ratios = " ".join(f"busy{b}={cpu[(policy, b)] / cpu[(policy, 0)]:.2f}" for b in (1, 2))
            print(f"cpu ratio busy/alone policy={policy} {ratios}")


if __name__ == "__main__":
    main()
