"""Every CLI command once on one device, each on its own, at the smoke recipe's sizes.

A failure in one command does not stop the others: each one's exit status, seconds and, for an
exception, its traceback are printed and written as JSON, so one run on a GPU machine finds every
broken command at once. Run from the repository root:

    python benchmarks/gpu_smoke.py --device cuda --out gpu_smoke.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path


def prompts_file(checkpoint: str, work: Path) -> str:
    """16 Gaussian prompts of the checkpoint's task, written as the .npz `icl-probe capture` reads."""
    import numpy as np

    task = json.loads((Path(checkpoint) / "config.json").read_text())["config"]["task"]
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((16, task["n_points"], task["n_dims"])).astype(np.float32)
    ys = xs @ rng.standard_normal((16, task["n_dims"], 1)).astype(np.float32)
    np.savez(work / "prompts.npz", xs=xs, ys=ys[..., 0])
    return str(work / "prompts.npz")


def commands(checkpoint: str, work: Path, device: str) -> dict[str, list[str]]:
    """name -> argv of `icl-probe`, each on `device` and writing under `work`."""
    common = [checkpoint, "--recipe", "smoke", "--device", device, "--force"]
    planted = str(work / "planted-gd")
    return {
        "train": ["train", "--recipe", "tiny", "--set", "train.steps=20", "--out", str(work / "train"), "--device", device],
        "evaluate": ["evaluate", checkpoint, "--prompts", "64", "--out", str(work / "evaluate"), "--device", device],
        "evaluate_shift": ["evaluate", checkpoint, "--prompts", "64", "--shift", "scale_x=2", "--out", str(work / "shift"), "--device", device],
        "capture": ["capture", checkpoint, "--prompts", prompts_file(checkpoint, work), "--out", str(work / "capture.npz"), "--device", device],
        "readout": ["readout", *common, "--out", str(work / "readout")],
        "heatmap": ["heatmap", *common, "--out", str(work / "heatmap")],
        "span": ["span", *common, "--out", str(work / "span")],
        "spectral": ["spectral", *common, "--out", str(work / "spectral")],
        "probes": ["probes", *common, "--out", str(work / "probes")],
        "order": ["order", *common, "--out", str(work / "order")],
        "ablate": ["ablate", *common, "--out", str(work / "ablate")],
        "patch": ["patch", *common, "--out", str(work / "patch")],
        "steer": ["steer", *common, "--out", str(work / "steer")],
        "resolution": ["resolution", "--dims", "4", "--prompts", "64", "--out", str(work / "resolution"), "--device", device],
        "planted": ["planted", "--algorithm", "gd", "--layers", "4", "--out", planted],
        "report_planted": ["report", planted, "--recipe", "smoke", "--device", device, "--out", str(work / "report-planted"), "--no-cache"],
        "report": ["report", *common, "--out", str(work / "report"), "--no-cache"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--checkpoint", default="checkpoints/gpt2-default")
    parser.add_argument("--only", nargs="*", help="run only these commands")
    parser.add_argument("--out", default="gpu_smoke.json")
    args = parser.parse_args()
    from probe.cli import main as cli

    work = Path(tempfile.mkdtemp(prefix="icl-probe-smoke-"))
    results = {}
    for name, argv in commands(args.checkpoint, work, args.device).items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            code, error = cli(["-q", *argv]), None
        except BaseException as exc:  # noqa: BLE001 - the point is to record every failure and go on
            code, error = -1, "".join(traceback.format_exception(exc))
        results[name] = {"exit": code, "seconds": round(time.perf_counter() - start, 2), "error": error}
        print(f"{name}: exit {code} in {results[name]['seconds']} s", flush=True)
        if error:
            print(error, flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    failed = [n for n, r in results.items() if r["exit"] != 0]
    print(f"smoke_failed={len(failed)} {' '.join(failed)}")


if __name__ == "__main__":
    main()
