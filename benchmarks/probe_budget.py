"""Do the report's probes depend on their iteration budget? The quick recipe's probe study on a
checkpoint, fitted twice on the same prompts: with the recipe's stopping rule, and with 10x the
iterations and 10x tighter tolerances (gtol, ftol). Prints the share of converged probes of each
and the largest R^2 difference over every (layer, prefix, target, kind, control); last line
`max_r2_diff=<x> converged=<share>`.

    python benchmarks/probe_budget.py [--checkpoint checkpoints/gpt2-default] [--recipe quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "checkpoints" / "gpt2-default"


def main() -> None:
    from probe.analysis.probe_study import probe_study
    from probe.io.formats import load_checkpoint
    from probe.reporting.recipe import resolve_recipe
    from probe.stages.probes import probe_control_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(DEFAULT))
    parser.add_argument("--recipe", default="quick")
    parser.add_argument("--set", action="append", default=[], help="recipe overrides (probes.gtol=1e-6)")
    args = parser.parse_args()
    ckpt = load_checkpoint(args.checkpoint)
    from probe.core.config import parse_override

    recipe = resolve_recipe(args.recipe, [parse_override(o) for o in args.set])
    settings = recipe.probes
    tight = dataclasses.replace(
        settings, max_iter=10 * settings.max_iter, gtol=settings.gtol / 10, ftol=settings.ftol / 10
    )
    control = probe_control_model(ckpt, recipe.prompts.seed)
    tables = {}
    for name, s in (("recipe", settings), ("10x", tight)):
        start = time.perf_counter()
        tables[name] = probe_study(ckpt.model, ckpt.config.task, s, recipe.prompts.test, recipe.prompts.seed,
                                   control_model=control)
        print(f"{name}: {time.perf_counter() - start:.1f} s, converged {tables[name].converged.mean():.3f}, "
              f"most iterations {tables[name].iterations.max()}")
    keys = ["layer", "prefix", "target", "kind", "control"]
    both = tables["recipe"].merge(tables["10x"], on=keys, suffixes=("", "_10x"))
    both["diff"] = (both.r2 - both.r2_10x).abs()
    for (kind, control), rows in both.groupby(["kind", "control"]):
        print(f"{kind:6s} {control:12s} largest difference {rows['diff'].max():.2e}")
    own = both[both.control == "none"].groupby(["layer", "target", "kind"])[["r2", "r2_10x"]].mean()
    by_layer = (own.r2 - own.r2_10x).abs().max()  # the summary's R^2 by layer: mean over prefixes
    print(f"model's probes, R^2 by (layer, target, kind) as the summary reports it: largest difference {by_layer:.2e}")
    worst = both.loc[both["diff"].idxmax()]
    print(f"largest difference at {dict(worst[keys])}: {worst.r2:.4f} vs {worst.r2_10x:.4f}")
    print(f"max_r2_diff={both['diff'].max():.2e} by_layer={by_layer:.2e} converged={tables['recipe'].converged.mean():.3f}")


if __name__ == "__main__":
    main()
