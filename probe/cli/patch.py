"""Activation patching through TransformerLens-named hooks, and the causal check of the layer-to-iteration map.

Clean prompts (X, y) and corrupted prompts (X, y') share the x's but not the function. For every
layer boundary (and block attention / MLP output, with --sites) and token position, the clean
activation is patched into the corrupted run; the fraction of the clean prediction restored at
the final query is reported with bootstrap intervals (patching.csv, patching_<site>.png).

Iteration-consistent patching (probe/interventions/patch.py documents the equation): for each
learner map "boundary l holds learner A after k(l) steps" (from --map-from, a best_match.csv
of `icl-probe heatmap` or a report's data/, or else computed here with SimE and the settings of
--recipe, as the report computes it), every token
before each query is patched at boundary l from the source run; observed against expected
fractions per boundary, and the claimed map against shuffled maps (iteration_<learner>.csv).

examples:
  icl-probe patch checkpoints/gpt2-default --out reports/patch
  icl-probe patch checkpoints/gpt2-default --out /tmp/p --map-from reports/gpt2-default-quick/data/best_match.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..core.resources import DEFAULT_CHECKPOINT
from .ablate import interventions_from_args
from .common import add_device, add_out, output_target, writing
from .layers import add_recipe_args, recipe_from_args, settings_from_args, write_run


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import PromptSettings, SimilaritySettings, add_flags
    from ..interventions.pipeline import InterventionSettings

    p.add_argument(
        "checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)"
    )
    add_out(p, "directory for patching.csv, iteration_*.csv, figures and summary.json")
    add_flags(
        p,
        "interventions",
        InterventionSettings,
        {"patch_prompts": "prompts", "sites": "sites", "query": "query", "max_positions": "max-positions"},
    )
    p.add_argument(
        "--learners",
        nargs="*",
        dest="interventions.learners",
        help="sweeps whose layer maps are checked causally; none: skip the check "
        "(recipe: interventions.learners; default auto = newton, gd_log and the replay sweeps present)",
    )
    p.add_argument("--map-from", default=None, help="best_match.csv with the layer maps (default: computed with SimE)")
    add_flags(p, "prompts", PromptSettings, ["seed"])
    add_flags(p, "similarity", SimilaritySettings, ["bootstrap"])
    add_recipe_args(p)
    add_device(p)


def layer_maps(args, ckpt, labels: list[str]) -> tuple[dict, list[int]]:
    import pandas as pd

    from ..analysis.pipeline import analyse_layers
    from ..core.errors import ConfigError
    from ..interventions.pipeline import degenerate_boundaries, layer_maps_from_best

    if not labels:
        return {}, []
    settings = settings_from_args(args, ckpt, tuple(labels), similarity={"simw": False})  # the report's layer settings
    sweeps = settings.sweeps
    if args.map_from is not None:
        path = Path(args.map_from)
        if not path.is_file():
            raise ConfigError(
                f"--map-from {path}: no such file; give the best_match.csv of `icl-probe heatmap` or a report"
            )
        try:
            best = pd.read_csv(path)
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(f"--map-from {path}: not a CSV table ({err})") from None
        if not {"sweep", "metric", "layer", "k"} <= set(best.columns):
            raise ConfigError(f"--map-from {path}: needs columns sweep, metric, layer, k (a best_match.csv)")
    else:
        best = analyse_layers(ckpt.model, ckpt.config.task, settings, progress=not args.quiet).best
    maps = layer_maps_from_best(best, sweeps)
    missing = [s.label for s in sweeps if s.label not in maps]
    if missing:
        raise ConfigError(f"--map-from {args.map_from}: no SimE best matches for {missing}")
    return maps, degenerate_boundaries(best, sweeps)


def run(args: argparse.Namespace) -> int:
    from ..core import budget
    from ..core.errors import ConfigError
    from ..core.provenance import display_path
    from ..interventions import figures as intervention_figures
    from ..interventions.pipeline import iteration_verdict
    from ..io.formats import load_checkpoint
    from ..models.sizes import shape_of

    target = output_target(args, "patch", (args.checkpoint, args.map_from))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)
    settings = recipe.interventions
    n = ckpt.config.task.n_points
    if settings.query is not None and not 1 <= settings.query < n:
        raise ConfigError(f"--query must lie in 1..{n - 1} (examples before the query), got {settings.query}")
    labels = settings.learner_labels(recipe.sweeps)
    budget.check(budget.intervention_estimates(shape_of(ckpt.model), n, settings, recipe.similarity.bootstrap))
    maps, skip = layer_maps(args, ckpt, labels)
    result = interventions_from_args(args, ckpt, recipe, settings, ("patch", "iteration"), layer_maps=maps, skip=skip)
    assert result.patching is not None  # patch=True
    with writing(target) as out:
        result.patching.to_csv(out / "patching.csv", index=False)
        for site in result.patching.site.unique():
            intervention_figures.patching(result.patching, site, out / f"patching_{site}")
        for label, frame in result.iteration.items():
            frame.to_csv(out / f"iteration_{label}.csv", index=False)
        if result.iteration:
            intervention_figures.iteration_consistency(result.iteration, out / "iteration_consistency")
        (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str) + "\n")
        write_run(out, {"command": "patch", "checkpoint": display_path(ckpt.path), "map_from": args.map_from})
    view = result.patching[result.patching.site == "resid"] if "resid" in settings.sites else result.patching
    table = view.pivot_table(index="layer", columns="token", values="restored", sort=False)
    print("fraction restored at the query (rows: layer; last columns):")
    print(table.iloc[:, -6:].to_string(float_format=lambda v: f"{v:.2f}"))
    for label, entry in result.summary.get("iteration", {}).items():
        print(iteration_verdict(label, entry))
    print(f"wrote {target.path}")
    return 0
