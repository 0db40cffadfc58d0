"""The spectral instrument's cost against the layers stage that feeds it (at most 25%).

Runs the report's layers stage (quick recipe) on a checkpoint `--repeats` times, alternating with
the stage without [spectral], and prints the median seconds of each and their ratio. The spectral
part reuses the stage's induced weights, so its own cost is the eigendecomposition of each prompt's
prefixes, the reference families' weights and the bootstrap. Last line: spectral_ratio=<ratio>.

    python benchmarks/spectral.py [checkpoints/gpt2-default] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import probe
from probe.analysis.pipeline import LayerSettings, analyse_layers
from probe.reporting.recipe import adapt_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="checkpoints/gpt2-default")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ckpt = probe.load_checkpoint(args.checkpoint)
    with_spectral = adapt_recipe(probe.recipe("quick"), ckpt.config)
    without = adapt_recipe(probe.recipe("quick", spectral={"enabled": False}), ckpt.config)
    seconds: dict[str, list[float]] = {"with": [], "without": [], "spectral_lap": []}
    for _ in range(args.repeats):
        for name, recipe in (("without", without), ("with", with_spectral)):
            start = time.perf_counter()
            result = analyse_layers(ckpt.model, ckpt.config.task, LayerSettings.from_recipe(recipe, "cpu"))
            seconds[name].append(time.perf_counter() - start)
            if name == "with":
                seconds["spectral_lap"].append(result.timings["spectral"])
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"layers stage without spectral: {med['without']:.2f} s (median of {args.repeats})")
    print(f"layers stage with spectral:    {med['with']:.2f} s; its spectral lap {med['spectral_lap']:.2f} s")
    print(f"spectral_ratio={med['spectral_lap'] / med['without']:.3f}")


if __name__ == "__main__":
    main()
