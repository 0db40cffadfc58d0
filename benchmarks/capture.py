"""Capture cost: time as a ratio to a bare forward pass, peak memory as a ratio to the bytes captured.

Capturing every layer boundary must cost one forward pass per batch (no per-layer re-runs).
Both numbers are measured in this run on the same prompts; the memory figure is the growth of
the process's peak resident set during capture (in a fresh subprocess) over the captured bytes.

    python benchmarks/capture.py [--checkpoint checkpoints/gpt2-default] [--prompts 2048]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "checkpoints" / "gpt2-default"


def _measure(checkpoint: str, prompts: int, mode: str, batch: int) -> dict:
    import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)
    # isort: split
    import torch

    from probe.analysis.evaluate import eval_prompts
    from probe.capture import RESID, capture
    from probe.io.formats import load_checkpoint

    torch.set_num_threads(1)
    ckpt = load_checkpoint(checkpoint)
    p = eval_prompts(ckpt.config.task, prompts, seed=1)
    capture(ckpt.model, p.xs[:8], p.ys[:8])  # warm up
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    if mode == "bare":
        with torch.no_grad():
            for s in range(0, prompts, batch):
                ckpt.model(p.xs[s : s + batch], p.ys[s : s + batch])
        captured = 0
    else:
        out = capture(ckpt.model, p.xs, p.ys, hooks=[RESID], batch_size=batch)
        captured = out.acts[RESID].nbytes + out.pred.nbytes
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "captured": captured, "peak_growth": peak - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(DEFAULT))
    parser.add_argument("--prompts", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--mode", choices=["bare", "capture"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(_measure(args.checkpoint, args.prompts, args.mode, args.batch_size)))
        return
    runs = {}
    for mode in ("bare", "capture", "bare", "capture"):  # interleaved: the CPU's speed drifts
        proc = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint, "--prompts", str(args.prompts),
                               "--mode", mode, "--batch-size", str(args.batch_size)], capture_output=True, text=True, check=True)
        runs.setdefault(mode, []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    bare = min(r["seconds"] for r in runs["bare"])
    cap = min(r["seconds"] for r in runs["capture"])
    captured = runs["capture"][0]["captured"]
    growth = min(r["peak_growth"] for r in runs["capture"])
    working = min(r["peak_growth"] for r in runs["bare"])  # what any forward pass of a batch needs
    print(f"bare forward: {bare:.2f} s, capture of every layer boundary: {cap:.2f} s "
          f"({args.prompts} prompts, batches of {args.batch_size})")
    print(f"captured {captured / 2**20:.1f} MiB; peak memory growth {growth / 2**20:.1f} MiB during capture, "
          f"{working / 2**20:.1f} MiB during the bare forward")
    print(f"time_ratio={cap / bare:.2f} (target <= 1.3)")
    print(f"memory_ratio={growth / captured:.2f} (peak growth / captured bytes; target <= 1.2)")
    print(f"memory_overhead_ratio={(growth - working) / captured:.2f} (beyond the forward's own working memory)")


if __name__ == "__main__":
    main()
