"""Ablations through TransformerLens: every attention head and MLP block zero- and mean-ablated
(mean over held-out prompts), and every layer's residual update skipped; the in-context error / d
against the number of examples for each, with bootstrap bands.

Writes ablation.csv (component, layer, head, kind, n_examples, error, error_lo, error_hi,
increase), ablation.png/svg (components x examples, error increase), summary.json, run.json.

examples:
  icl-probe ablate checkpoints/gpt2-default --out reports/ablate
  icl-probe ablate checkpoints/planted/gd --out /tmp/a --kinds skip
"""

from __future__ import annotations

import argparse
import json

from ..resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, positive_int, writing
from .layers import add_recipe_args, recipe_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)"
    )
    add_out(p, "directory for ablation.csv, the figure and summary.json")
    p.add_argument(
        "--prompts",
        type=positive_int,
        help="evaluation prompts, and as many held out (default: the recipe's interventions.prompts)",
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=["zero", "mean", "skip"],
        help="ablation kinds (default: the recipe's interventions.kinds)",
    )
    p.add_argument("--seed", type=int, help="seed (default: the recipe's prompts.seed)")
    p.add_argument(
        "--bootstrap", type=positive_int, help="bootstrap resamples (default: the recipe's similarity.bootstrap)"
    )
    p.add_argument(
        "--no-heads",
        action="store_true",
        help="layer skips and MLPs only (default: every attention head too, whatever the recipe says)",
    )
    add_recipe_args(p)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..formats import load_checkpoint
    from ..interventions.pipeline import InterventionSettings, run_interventions
    from ..provenance import display_path, stamp
    from ..report import intervention_figures

    target = output_target(args, "ablate", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)
    iv = recipe.interventions
    settings = InterventionSettings(
        n_prompts=args.prompts or iv.prompts,
        kinds=tuple(args.kinds or iv.kinds),
        heads=not args.no_heads,
        patch=False,
        iteration=False,
        n_boot=recipe.similarity.bootstrap,
        seed=recipe.prompts.seed,
        device=check_device(args.device),
    )
    result = run_interventions(ckpt.model, ckpt.config.task, settings, progress=not args.quiet)
    assert result.ablation is not None  # ablate=True
    with writing(target) as out:
        result.ablation.to_csv(out / "ablation.csv", index=False)
        intervention_figures.ablation(result.ablation, out / "ablation")
        (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str) + "\n")
        (out / "run.json").write_text(
            json.dumps({"command": "ablate", "checkpoint": display_path(ckpt.path), **stamp()}, indent=2, default=str)
            + "\n"
        )
    entry = result.summary["ablation"]
    print(f"error / d at {entry['n_examples']} examples: unablated {entry['baseline_error']:.4f}")
    print("layer skipped: " + " ".join(f"L{l} {e:.3f}" for l, e in zip(entry["skip"]["layer"], entry["skip"]["error"])))
    for row in entry["most_harmful"]:
        where = f"L{row['layer']}.H{row['head']}" if row["component"] == "head" else f"L{row['layer']}.MLP"
        print(f"  {where} {row['kind']}: +{row['increase']:.3f}")
    print(f"wrote {target.path}")
    return 0
