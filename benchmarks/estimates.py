"""Each stage's up-front cost estimate against its measured time: the quick report of the default
checkpoint (and, with --paper-scale, of the Garg-standard model of benchmarks/paper_scale.py), each
stage's estimated work (the sum of its `estimates`, probe/core/budget.py) over its seconds in that
report (summary.json `timings`) as an effective rate, and each stage's time against its work at the
median rate of the report's stages: within 2x is what the up-front check needs to stop the right
recipe. Last line: `worst_ratio=<x> stage=<name>` (the stage furthest from the median rate, as a
factor >= 1).
Run from the repository root:  python benchmarks/estimates.py [--paper-scale]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage_work(ckpt_path: Path) -> dict[str, float]:
    """Estimated floating-point work per registered stage the quick recipe runs on this checkpoint."""
    from probe.core.stages import registered
    from probe.io.formats import load_checkpoint
    from probe.reporting.recipe import adapt_recipe, resolve_recipe

    ckpt = load_checkpoint(ckpt_path)
    recipe = adapt_recipe(resolve_recipe("quick"), ckpt.config)
    out = {}
    for name, stage in registered().items():
        if stage.enabled(recipe) and not stage.refusal(ckpt) and stage.estimates is not None:
            out[name] = sum(e.flop for e in stage.estimates(recipe, ckpt))
    return out


def compare(ckpt_path: Path, out: Path) -> float:
    subprocess.run([sys.executable, "-m", "probe", "-q", "report", str(ckpt_path), "--out", str(out), "--no-cache"],
                   check=True, cwd=REPO)  # fmt: skip
    seconds = json.loads((out / "summary.json").read_text())["timings"]
    work = stage_work(ckpt_path)
    rates = {n: work[n] / seconds[n] for n in work if seconds.get(n, 0) > 0 and work[n] > 0}
    middle = statistics.median(rates.values())
    worst, worst_stage = 1.0, ""
    print(f"{ckpt_path}: median rate {middle:.2e} flop/s")
    for name, rate in rates.items():
        factor = max(rate / middle, middle / rate)
        if factor > worst:
            worst, worst_stage = factor, name
        flag = "" if factor <= 2 else "  (outside 2x)"
        print(f"  {name:14s} work {work[name]:.2e}  {seconds[name]:7.1f} s  rate {rate:.2e}  x{factor:.1f}{flag}")
    print(f"worst_ratio={worst:.1f} stage={worst_stage}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper-scale", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compare(REPO / "checkpoints" / "gpt2-default", Path(tmp) / "default")
        if args.paper_scale:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from paper_scale import paper_model

            compare(paper_model(Path(tmp) / "paper"), Path(tmp) / "paper-report")


if __name__ == "__main__":
    main()
