"""Planted models against the 8-layer GPT-2 default, in one run (issue: planted models near their floor).

For the default and each planted checkpoint in checkpoints/planted/, runs the quick report
(`icl-probe report CKPT --no-cache`) and `icl-probe evaluate CKPT` as child processes, and prints
their wall, user and system seconds (the children's rusage), the report's stage timings
(summary.json), and each family's report time as a ratio to the default's. The system share is
system / user seconds of a command (allocation churn shows there). Last line:
`worst_ratio=<x> family=<name> max_sys_share=<y>`.

    python benchmarks/planted.py [--families adam newton ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "checkpoints" / "planted"


def timed(args: list[str]) -> dict[str, float]:
    """Wall, user and system seconds of one child process (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=sorted(p.name for p in PLANTED.iterdir() if p.is_dir()))
    parser.add_argument("--out", default=None, help="where the reports go (default: a temporary directory)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="planted-bench-"))
    cli = [sys.executable, "-m", "probe"]
    checkpoints = {"default": ROOT / "checkpoints" / "gpt2-default"} | {f: PLANTED / f for f in args.families}
    rows = {}
    for name, ckpt in checkpoints.items():
        report = timed([*cli, "report", str(ckpt), "--out", str(out / name), "--force", "--no-cache"])
        evaluate = timed([*cli, "evaluate", str(ckpt), "--out", str(out / f"{name}-eval"), "--force"])
        stages = json.loads((out / name / "summary.json").read_text())["timings"]
        rows[name] = {"report": report, "evaluate": evaluate, "stages": stages}
        print(f"{name}: report {report['wall']:.1f} s wall ({report['user']:.1f} user, {report['sys']:.1f} sys); "
              f"evaluate {evaluate['wall']:.1f} s ({evaluate['user']:.1f} user, {evaluate['sys']:.1f} sys)", flush=True)
        print("  stages: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()), flush=True)
    base = rows["default"]
    print(f"\n{'model':<12} {'report':>8} {'ratio':>6} {'evaluate':>9} {'ratio':>6} {'sys/user':>9}")
    worst, worst_name, max_share = 0.0, "default", 0.0
    for name, row in rows.items():
        ratio = row["report"]["wall"] / base["report"]["wall"]
        eval_ratio = row["evaluate"]["wall"] / base["evaluate"]["wall"]
        share = max(r["sys"] / max(r["user"], 1e-9) for r in (row["report"], row["evaluate"]))
        max_share = max(max_share, share)
        if name != "default" and ratio > worst:
            worst, worst_name = ratio, name
        print(f"{name:<12} {row['report']['wall']:>7.1f}s {ratio:>6.2f} {row['evaluate']['wall']:>8.1f}s "
              f"{eval_ratio:>6.2f} {share:>9.3f}")
    print(f"worst_ratio={worst:.2f} family={worst_name} max_sys_share={max_share:.3f}")


if __name__ == "__main__":
    main()
