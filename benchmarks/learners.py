"""Batched reference learners vs a straightforward per-prompt loop (issue: learners, batched).

Workload: d=20, n=40, 1280 prompts; Iterative Newton 0..24; GD (paper convention, per-prefix
step 1/lambda_max) on the log grid 0, 1, 2, ..., 4096 steps; SimE of every Newton iterate against
every GD count. The loop version is what the papers' scripts do: numpy per prompt and prefix.
It is timed on a subset of prompts and scaled linearly to 1280 (its cost is linear in prompts);
both versions are checked to agree to 1e-5 on that subset. Then each learner alone (nothing
shared) against the machine's own batched products, in the same run: its seconds per iteration it
represents (Newton: 24 iterations; GD: 4096 steps) over the bare products of one iteration at the
same shapes (Newton M <- 2M - M S M: two (B n, d, d) matmuls; GD w <- w - eta (S w - b)/t: one
(B n, d, d) x (B n, d) product). Last line: speedup=<ratio>.

    python benchmarks/learners.py [--loop-prompts 16] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)

# isort: split
import torch

from probe.analysis.similarity import sime
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.learners import run_learner
from probe.learners.iterative import LOG_STEPS

NEWTON_ITS = list(range(25))


def loop_one_prompt(x: np.ndarray, y: np.ndarray):
    n, d = x.shape
    newton = np.zeros((len(NEWTON_ITS), n))
    gd = np.zeros((len(LOG_STEPS), n))
    for t in range(1, n):
        xt, yt = x[:t], y[:t]
        s, b = xt.T @ xt, xt.T @ yt
        m = s / np.linalg.norm(s @ s.T, 2)
        for k in NEWTON_ITS:
            newton[k, t] = x[t] @ (m @ b)
            m = 2 * m - m @ s @ m
        eta = 1 / np.linalg.eigvalsh(s / t).max()
        w = np.zeros(d)
        for k in range(LOG_STEPS[-1] + 1):
            if k in LOG_STEPS:
                gd[LOG_STEPS.index(k), t] = x[t] @ w
            w = w - eta * (s @ w - b) / t
    res_n, res_g = newton[:, 1:] - y[1:], gd[:, 1:] - y[1:]
    res_n /= np.maximum(np.linalg.norm(res_n, axis=1, keepdims=True), 1e-12)
    res_g /= np.maximum(np.linalg.norm(res_g, axis=1, keepdims=True), 1e-12)
    return newton, gd, res_n @ res_g.T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1280)
    parser.add_argument("--loop-prompts", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    task = TaskConfig(n_dims=20, n_points=40)
    p = sample_prompts(task, args.prompts, generator=generator_for(0))
    xs, ys = p.xs.double().to(args.device), p.ys.double().to(args.device)

    start = time.perf_counter()
    newton = run_learner("newton", xs, ys, iterations=NEWTON_ITS)
    gd = run_learner("gd", xs, ys, steps=LOG_STEPS)
    sim = sime(newton.preds, gd.preds, ys)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    batched = time.perf_counter() - start

    xs_np, ys_np = xs.cpu().numpy(), ys.cpu().numpy()
    start = time.perf_counter()
    worst = 0.0
    for b in range(args.loop_prompts):
        n_ref, g_ref, s_ref = loop_one_prompt(xs_np[b], ys_np[b])
        worst = max(worst,
                    np.abs(newton.preds[:, b, 1:].cpu().numpy() - n_ref[:, 1:]).max(),
                    np.abs(gd.preds[:, b, 1:].cpu().numpy() - g_ref[:, 1:]).max(),
                    np.abs(sim[:, :, b].cpu().numpy() - s_ref).max())
    loop = (time.perf_counter() - start) * args.prompts / args.loop_prompts
    print(f"batched: {batched:.2f} s for {args.prompts} prompts on {args.device}")
    print(f"loop:    {loop:.1f} s (measured on {args.loop_prompts} prompts, scaled to {args.prompts})")
    print(f"max abs difference on the shared prompts: {worst:.2e}")
    if worst > 1e-5:
        raise SystemExit(f"batched and loop results differ by {worst:.2e} > 1e-5")
    for name, per_iteration, iterations in alone(xs, ys):
        print(f"{name}: {per_iteration:.2f} x a bare iteration's batched products ({iterations} iterations)")
    print(f"speedup={loop / batched:.1f}")


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def alone(xs: torch.Tensor, ys: torch.Tensor):
    """(learner, its time per iteration / one iteration's bare products, iterations) with nothing
    shared between the learners (the eigendecomposition cache cleared before each run)."""
    from probe.learners.iterative import LAST_PROMPTS

    b, n, d = xs.shape
    s = torch.randn(b * n, d, d, dtype=xs.dtype, device=xs.device)
    s = s @ s.transpose(1, 2)
    w = torch.randn(b * n, d, 1, dtype=xs.dtype, device=xs.device)
    matmul = best_of(lambda: 2 * s - s @ s @ s)
    matvec = best_of(lambda: w - 0.1 * (s @ w - w))

    def run(name, **grid):
        LAST_PROMPTS.clear()
        run_learner(name, xs, ys, **grid)

    newton = best_of(lambda: run("newton", iterations=NEWTON_ITS))
    gd = best_of(lambda: run("gd", steps=LOG_STEPS))
    yield "newton", newton / (len(NEWTON_ITS) - 1) / matmul, len(NEWTON_ITS) - 1
    yield "gd", gd / LOG_STEPS[-1] / matvec, LOG_STEPS[-1]


if __name__ == "__main__":
    main()
