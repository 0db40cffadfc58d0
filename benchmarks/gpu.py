"""The GPU path checked against CPU in one run: the quick report of the default
checkpoint (and, with --paper-scale, of the Garg-standard model at random init, as
benchmarks/paper_scale.py builds it) on each device, every summary.json number compared with the
first device's, each stage timed, and a short `icl-probe train` on the last device. Writes the
results as JSON and prints, last, one line:

    gpu_speedup=<first device's report seconds / last device's> max_rel_diff=<largest relative difference of a result number>

Continuous numbers are compared per summary.json block with the tolerances in TOLERANCES (each
with its reason); discrete ones (best k, best layer, verdicts, classes) must be equal, and every
mismatch is listed. Without a GPU, `--devices cpu cpu` runs the whole comparison on the CPU (the
numbers must then agree to the last bit but for thread scheduling, which is the check's own test).

    python benchmarks/gpu.py --devices cpu cuda --out benchmarks/gpu_results.json [--paper-scale]

The L-BFGS probes' stopping diagnostics (DIAGNOSTIC_KEYS) are listed apart, not counted in
max_rel_diff: where an optimiser stops depends on its path, and on a GPU the path differs in the
last bits from the first iteration on.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# relative tolerance per top-level summary.json block, and why: the learners, probes and read-outs
# compute in float64 on every device; the model's forward runs in float32, where CUDA's kernels
# (TF32 off, other reduction orders) differ from MKL's by ~1e-6 relative per layer
TOLERANCES = {
    "icl_error": (1e-4, "the model's float32 forward: reduction order differs between MKL and cuBLAS"),
    "readout": (1e-4, "float64 ridge read-outs on float32 states"),
    "best_match": (1e-4, "similarities of float32 layer predictions with float64 learners"),
    "trend": (1e-3, "fits of best-matching k; k itself must be equal"),
    "table1": (1e-4, "as best_match"),
    "verdicts": (1e-3, "paired differences of similarities that agree to 1e-4"),
    "nulls": (1e-4, "as best_match"),
    "span": (1e-4, "float64 projections of float32-derived induced weights"),
    "spectral": (1e-3, "exponents are slopes of log(-log(1 - r)): relative error grows near r = 0 and 1"),
    "probes": (1e-3, "L-BFGS on float64 pooled states stops at a tolerance, not at a bit pattern"),
    "forgetting": (1e-4, "the model's float32 forward"),
    "order_sensitivity": (1e-3, "shares of small variances"),
    "interventions": (1e-3, "patched float32 forwards, ratios of sums"),
    "evidence": (1e-3, "as verdicts"),
    "token_probes": (1e-4, "float64 ridge probes on float64 streams (the model run in double on a copy)"),
    "ood": (1e-3, "distances of float32 model predictions to float64 learners off distribution; shares are counts"),
}
DEFAULT_TOLERANCE = (1e-4, "not listed: the model's float32 forward")
SKIP = {"timings", "created", "versions", "git_commit", "cached_stages", "recipe", "checkpoint"}
DISCRETE_KEYS = {"k", "k_low", "k_high", "best_layer", "best_index", "best_k", "verdict", "winner", "best_class"}
# the optimiser's own diagnostics: where L-BFGS stops (gradient norm at the stop, iterations used)
# follows its trajectory, not the fit; listed beside the comparison, kept out of max_rel_diff. That
# both runs converged is compared exactly (probes' converged_share is a result number)
DIAGNOSTIC_KEYS = {"max_grad_norm", "max_iterations"}


def compare(reference: Any, other: Any, path: str = "") -> tuple[list[dict], list[dict]]:
    """Continuous and discrete differences between two summary.json trees: ([{path, a, b, rel,
    tolerance, within, diagnostic}], [{path, a, b}]). Strings, booleans and the DISCRETE_KEYS must
    be equal; DIAGNOSTIC_KEYS are compared but marked (never `within` a tolerance)."""
    continuous: list[dict] = []
    discrete: list[dict] = []
    _walk(reference, other, path, continuous, discrete)
    return continuous, discrete


def results_only(continuous: list[dict]) -> list[dict]:
    """The compared numbers that are results, not optimiser diagnostics."""
    return [c for c in continuous if not c["diagnostic"]]


def block_maxima(continuous: list[dict]) -> dict[str, float]:
    """Largest relative difference per top-level summary.json block (results only)."""
    out: dict[str, float] = {}
    for c in results_only(continuous):
        block = c["path"].split(".")[0]
        out[block] = max(out.get(block, 0.0), c["rel"])
    return out


def _walk(a: Any, b: Any, path: str, continuous: list[dict], discrete: list[dict]) -> None:
    top = path.split(".")[0] if path else ""
    if top in SKIP:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                discrete.append({"path": f"{path}.{key}".lstrip("."), "a": a.get(key, "<missing>"), "b": b.get(key, "<missing>")})
            else:
                _walk(a[key], b[key], f"{path}.{key}".lstrip("."), continuous, discrete)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            discrete.append({"path": path, "a": f"{len(a)} items", "b": f"{len(b)} items"})
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{path}.{i}", continuous, discrete)
        return
    leaf = path.split(".")[-2] if path.split(".")[-1].isdigit() and "." in path else path.split(".")[-1]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numeric or leaf in DISCRETE_KEYS:
        if a != b:
            discrete.append({"path": path, "a": a, "b": b})
        return
    tol, _ = TOLERANCES.get(top, DEFAULT_TOLERANCE)
    rel, diagnostic = _relative(float(a), float(b)), leaf in DIAGNOSTIC_KEYS
    within = rel <= tol and not diagnostic
    continuous.append({"path": path, "a": a, "b": b, "rel": rel, "tolerance": tol, "within": within, "diagnostic": diagnostic})


def _relative(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def report_on(checkpoint: Path, device: str, out: Path, recipe: str) -> tuple[dict, float]:
    """The report of `checkpoint` on `device` as a user runs it, `icl-probe report` in a child process
    without the cache (its figures drawn in a worker beside the stages; a report called from a script
    such as this one draws them in its own process, on the critical path): (summary.json, wall
    seconds, the child's start-up included)."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "probe", "-q", "report", str(checkpoint), "--recipe", recipe]
    subprocess.run([*command, "--out", str(out), "--device", device, "--no-cache", "--force"], check=True, cwd=REPO)
    return json.loads((out / "summary.json").read_text()), time.perf_counter() - start


def train_on(device: str, out: Path, steps: int) -> float:
    """Seconds of a short `icl-probe train` of the tiny recipe on `device`."""
    from probe.cli import main

    start = time.perf_counter()
    code = main(["-q", "train", "--recipe", "tiny", "--set", f"train.steps={steps}", "--out", str(out), "--device", device])
    if code != 0:
        raise SystemExit(f"training on {device} failed with exit status {code}")
    return time.perf_counter() - start


def checked(reference: dict, other: dict) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """`compare` of two summaries: (every continuous difference, the result numbers among them, those
    outside their tolerance, the discrete mismatches)."""
    continuous, discrete = compare(reference, other)
    numbers = results_only(continuous)
    return continuous, numbers, [c for c in numbers if not c["within"]], discrete


def compare_files(reference: Path, other: Path) -> None:
    """Print the comparison of two summary.json files as a run prints it, and each block's largest
    relative difference."""
    continuous, numbers, outside, discrete = checked(json.loads(reference.read_text()), json.loads(other.read_text()))
    for c in outside + discrete:
        print("  ", c)
    print(json.dumps(block_maxima(continuous), indent=1))
    print(f"{reference} vs {other}: {len(numbers)} numbers, {len(outside)} outside tolerance, "
          f"{len(discrete)} discrete mismatches; max_rel_diff={max((c['rel'] for c in numbers), default=0.0):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"], help="first is the reference")
    parser.add_argument("--checkpoint", default="checkpoints/gpt2-default")
    parser.add_argument("--recipe", default="quick")
    parser.add_argument("--paper-scale", action="store_true", help="also the Garg-standard model (random init)")
    parser.add_argument("--train-steps", type=int, default=50)
    parser.add_argument("--out", default="benchmarks/gpu_results.json")
    parser.add_argument("--skip-default", action="store_true", help="only the paper-scale model (with --paper-scale)")
    parser.add_argument("--summaries", help="also write each run's summary.json into this directory")
    parser.add_argument("--compare", nargs=2, metavar=("REFERENCE", "OTHER"),
                        help="only compare two summary.json files already written (a device run's against a CPU one)")
    args = parser.parse_args()
    if args.compare:
        compare_files(*map(Path, args.compare))
        return
    work = Path(tempfile.mkdtemp(prefix="icl-probe-gpu-"))
    checkpoints = {} if args.skip_default else {"default": Path(args.checkpoint)}
    if args.paper_scale:
        from paper_scale import paper_model  # benchmarks/paper_scale.py, beside this script

        checkpoints["paper_scale"] = paper_model(work / "paper")
    results: dict[str, Any] = {"devices": args.devices, "tolerances": {k: v[0] for k, v in TOLERANCES.items()}}
    worst, seconds = 0.0, {d: 0.0 for d in args.devices}
    for name, ckpt in checkpoints.items():
        runs = {}
        for i, device in enumerate(args.devices):
            summary, wall = report_on(ckpt, device, work / f"{name}-{i}-{device}", args.recipe)
            label = device if device not in runs else f"{device}#{i}"
            runs[label] = (summary, wall)
            seconds[device] += wall
            results.setdefault(f"{name}:report_seconds", {})[label] = {"wall": wall, "stages": summary["timings"]}
            print(f"{name} on {label}: {wall:.1f} s")
            if args.summaries:
                Path(args.summaries).mkdir(parents=True, exist_ok=True)
                (Path(args.summaries) / f"{name}-{i}-{device}.json").write_text(json.dumps(summary, indent=1) + "\n")
        (ref, ref_wall), *others = runs.values()
        for label, (summary, wall) in zip(list(runs)[1:], others):
            continuous, numbers, outside, discrete = checked(ref, summary)
            worst = max([worst, *(c["rel"] for c in numbers)])
            results[f"{name}:{label}"] = {
                "wall_seconds": {"reference": ref_wall, label: wall},
                "stage_seconds": {"reference": ref["timings"], label: summary["timings"]},
                "numbers_compared": len(numbers),
                "max_rel_diff": max((c["rel"] for c in numbers), default=0.0),
                "max_rel_diff_by_block": block_maxima(continuous),
                "outside_tolerance": outside[:50],
                "discrete_mismatches": discrete[:50],
                "optimiser_diagnostics": [c for c in continuous if c["diagnostic"]][:50],
            }
            print(f"{name} {args.devices[0]} vs {label}: {len(numbers)} numbers, {len(outside)} outside tolerance, "
                  f"{len(discrete)} discrete mismatches; {ref_wall:.1f} s vs {wall:.1f} s")
        Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")  # what is done so far
    results["train_seconds"] = {args.devices[-1]: train_on(args.devices[-1], work / "train", args.train_steps)}
    speedup = seconds[args.devices[0]] / max(seconds[args.devices[-1]], 1e-9)
    results["gpu_speedup"], results["max_rel_diff"] = speedup, worst
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"gpu_speedup={speedup:.2f} max_rel_diff={worst:.2e}")


if __name__ == "__main__":
    main()
