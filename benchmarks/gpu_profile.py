"""Where a device's time goes in the paper-scale quick report: the stages of the Garg-standard
model's quick report (benchmarks/paper_scale.py `paper_model`, random init) run in this process on
`--device` under cProfile, no figures drawn and no cache. Prints each stage's seconds (profiled:
cProfile slows interpreted loops, so compare stages within a run, and take the report's own times
from benchmarks/gpu.py), then the functions with the most own time and the most time below them,
and writes the profile (pstats) beside them. On a GPU the time of asynchronous kernels lands on
the call that waits for them (`.item()`, `.cpu()`, `torch.linalg` solvers that synchronise).

    python benchmarks/gpu_profile.py --device cuda --out gpu_profile.txt [--only token_probes probes]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="gpu_profile.txt")
    parser.add_argument("--only", nargs="*", help="these stages (and the stages they need); default every stage")
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()

    from paper_scale import paper_model  # benchmarks/paper_scale.py, beside this script

    from probe import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import resolve_recipe

    ckpt = load_checkpoint(paper_model(Path(tempfile.mkdtemp(prefix="icl-probe-profile-")) / "paper"))
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    built = run_stages(ckpt, resolve_recipe("quick"), args.device, StageCache(None), False, only=set(args.only or []) or None)
    profiler.disable()
    wall = time.perf_counter() - start
    text = io.StringIO()
    text.write(f"device={args.device} wall={wall:.1f} s (profiled)\n")
    for name, seconds in sorted(built.timings.items(), key=lambda kv: -kv[1]):
        text.write(f"  {name:<16} {seconds:8.2f} s\n")
    for key in ("tottime", "cumulative"):
        text.write(f"\n--- top {args.top} by {key} ---\n")
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(args.top)
    Path(args.out).write_text(text.getvalue())
    profiler.dump_stats(str(Path(args.out).with_suffix(".pstats")))
    print(text.getvalue()[:4000])


if __name__ == "__main__":
    main()
