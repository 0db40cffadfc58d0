"""Figures off the critical path: how long the report's own process is blocked on figures, over the
report's wall time, on the default checkpoint's quick report (each run in a child process,
`icl-probe report --no-cache`; the report's figures are drawn in a worker process while later
stages compute, probe/reporting/figure_pool.py, and its `timings.figures` is the time the report
waited on them). Beside it, the seconds the same figures take drawn one after another in one
process (probe.reporting.rerender on the finished report, which draws every figure and the page again).
Last line: `figures_share=<median> sequential_s=<median> wall_s=<median>` over --runs runs (default 3).
Run from the repository root:  python benchmarks/figures.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ICL = [sys.executable, "-m", "probe", "-q"]


def one_run(out: Path) -> tuple[float, float, float]:
    """(figures share, sequential figure seconds, wall seconds) of one report."""
    start = time.perf_counter()
    subprocess.run([*ICL, "report", "checkpoints/gpt2-default", "--out", str(out), "--no-cache"], check=True, cwd=REPO)
    wall = time.perf_counter() - start
    blocked = json.loads((out / "summary.json").read_text())["timings"]["figures"]
    start = time.perf_counter()
    redraw = f"from probe.reporting.rerender import rerender_report; rerender_report({str(out)!r})"
    subprocess.run([sys.executable, "-c", redraw], check=True, cwd=REPO)
    sequential = time.perf_counter() - start
    return blocked / wall, sequential, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            share, sequential, wall = one_run(Path(tmp) / f"r{i}")
            rows.append((share, sequential, wall))
            print(f"run {i}: blocked on figures {share * wall:.2f} s of {wall:.1f} s (share {share:.3f}); "
                  f"the same figures drawn in one process {sequential:.1f} s (rerender, page included)")
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"figures_share={med[0]:.3f} sequential_s={med[1]:.1f} wall_s={med[2]:.1f}")


if __name__ == "__main__":
    main()
