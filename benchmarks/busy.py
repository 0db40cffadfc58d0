"""The default report on a busy machine: CPU seconds and wall time of
`icl-probe report` (the shipped default checkpoint, quick recipe) alone and beside one and two
busy processes (each a Python loop on one core), under each of `--policies`: "default" (icl-probe's
own choice, passive waits, probe/core/omp.py), PASSIVE, ACTIVE (idle threads spin) or POLICY:SPINS
(libgomp's GOMP_SPINCOUNT: a short spin before sleeping), and whether every number of the report is
the committed one's.

    .venv/bin/python benchmarks/busy.py            # about 6 minutes on this project's 2-core machine
    .venv/bin/python benchmarks/busy.py --policies default,PASSIVE:3000 --busy 0,1

Prints one line per run and the CPU ratio busy / alone per policy (the target: within 1.2x)."""

from __future__ import annotations

import argparse
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


def policy_env(policy: str) -> dict[str, str]:
    """The environment of one `--policies` entry: "default" (neither variable set: icl-probe's own
    choice, probe/core/omp.py), or POLICY or POLICY:SPINS (OMP_WAIT_POLICY, and libgomp's
    GOMP_SPINCOUNT: busy-wait iterations before an idle thread sleeps; without it libgomp's default
    for the policy)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy == "default":
        return env
    name, _, spins = policy.partition(":")
    env["OMP_WAIT_POLICY"] = name
    if spins:
        env["GOMP_SPINCOUNT"] = spins
    return env


def run_report(out: Path, policy: str) -> tuple[float, float]:
    """(wall s, CPU s of the report process) of one quick report into `out`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = policy_env(policy)
    subprocess.run([sys.executable, "-m", "probe", "-q", "report", "--out", str(out), "--force", "--no-cache"],
                   env=env, check=True, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from test_shipped import _numbers_differ

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="default,PASSIVE,ACTIVE", help="comma-separated: default, POLICY[:SPINS]")
    parser.add_argument("--busy", default="0,1,2", help="comma-separated counts of busy processes (0 first)")
    args = parser.parse_args()
    policies, counts = args.policies.split(","), [int(b) for b in args.busy.split(",")]
    committed = json.loads((REPO / "reports" / "gpt2-default-quick" / "summary.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cpu: dict[tuple[str, int], float] = {}
        for policy in policies:
            for busy in counts:
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
        for policy in policies:
            ratios = " ".join(f"busy{b}={cpu[(policy, b)] / cpu[(policy, counts[0])]:.2f}" for b in counts[1:])
            print(f"cpu ratio busy/alone policy={policy} {ratios}")


if __name__ == "__main__":
    main()
