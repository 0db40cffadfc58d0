"""Probes fitted as one batched grid vs one probe at a time (same data, same stopping rule).

The grid is every layer x prefix x target of a checkpoint (linear probes). The one-at-a-time
time is measured on a few probes spread over the grid and scaled to it. Both are timed in this
run with the same torch thread count (`--threads`, default: torch's default for the machine);
last line: speedup=<ratio>.

    python benchmarks/probes.py [--checkpoint checkpoints/gpt2-default] [--single 6] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)

# isort: split
import torch

DEFAULT = Path(__file__).resolve().parents[1] / "checkpoints" / "gpt2-default"


def main() -> None:
    from probe.analysis.probe_study import default_prefixes
    from probe.analysis.probes import AttentionPoolProbe, fit_probes, probe_targets
    from probe.capture import RESID, capture
    from probe.data.tasks import generator_for, sample_prompts
    from probe.io.formats import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(DEFAULT))
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--single", type=int, default=6, help="probes timed one at a time")
    parser.add_argument("--prefixes", choices=["all", "default"], default="all",
                        help="probe every prefix 1..n-1 (all, default) or 1, d, 2d, n-1")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    ckpt = load_checkpoint(args.checkpoint)
    task = ckpt.config.task
    p = sample_prompts(task, args.prompts, generator=generator_for(0, 201))
    states = torch.as_tensor(np.asarray(capture(ckpt.model, p.xs, p.ys, hooks=[RESID]).acts[RESID]))
    targets = {k: probe_targets(p.xs, p.ys, k) for k in ("xty", "w_ols")}
    prefixes = range(1, task.n_points) if args.prefixes == "all" else default_prefixes(task.n_dims, task.n_points)
    combos = [(t, k) for t in prefixes for k in targets]
    n_probes = states.shape[0] * len(combos)

    start = time.perf_counter()
    fit_probes(states, targets, states, targets, combos, "linear")
    batched = time.perf_counter() - start

    start = time.perf_counter()
    done = 0
    picks = np.linspace(0, n_probes - 1, args.single).round().astype(int)  # spread over layers and prefixes
    for i in picks:
        layer, (t, k) = divmod(int(i), len(combos))[0], combos[int(i) % len(combos)]
        AttentionPoolProbe("linear").fit(states[layer, :, : 2 * t], targets[k][:, t])
        done += 1
    single = (time.perf_counter() - start) / done * n_probes
    print(f"{n_probes} probes ({states.shape[0]} layers x {len(combos)} prefix/target pairs)")
    print(f"batched: {batched:.2f} s; one at a time: {single:.1f} s (measured on {done}, scaled to {n_probes})")
    print(f"speedup={single / batched:.1f}")


if __name__ == "__main__":
    main()
