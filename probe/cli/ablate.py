"""Ablations through TransformerLens-named hooks: every attention head and MLP block zero- and mean-ablated
(mean over held-out prompts), and every layer's residual update skipped; the in-context error / d
against the number of examples for each, with bootstrap bands.

Writes ablation.csv (component, layer, head, kind, n_examples, error, error_lo, error_hi,
increase), ablation.png (components x examples, error increase), summary.json, run.json.

examples:
  icl-probe ablate checkpoints/gpt2-default --out reports/ablate
  icl-probe ablate checkpoints/planted/gd --out /tmp/a --kinds skip
"""

from __future__ import annotations

import argparse
import json

from ..core.resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, writing
from .layers import add_recipe_args, recipe_from_args, write_run


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import PromptSettings, SimilaritySettings, add_flags
    from ..interventions.pipeline import InterventionSettings

    p.add_argument(
        "checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)"
    )
    add_out(p, "directory for ablation.csv, the figure and summary.json")
    add_flags(p, "interventions", InterventionSettings, ["prompts", "kinds", "heads"])
    p.set_defaults(**{"interventions.heads": True})  # this command ablates every head unless --no-heads
    add_flags(p, "prompts", PromptSettings, ["seed"])
    add_flags(p, "similarity", SimilaritySettings, ["bootstrap"])
    add_recipe_args(p)
    add_device(p)


def interventions_from_args(args: argparse.Namespace, ckpt, recipe, settings, parts: tuple[str, ...], **maps):
    """run_interventions of the command's `parts` on the checkpoint, with the recipe's seed and
    bootstrap, the --device and a progress bar unless --quiet (`maps`: patch's layer maps, skip)."""
    from ..interventions.pipeline import run_interventions

    return run_interventions(
        ckpt.model,
        ckpt.config.task,
        settings,
        parts=parts,
        n_boot=recipe.similarity.bootstrap,
        seed=recipe.prompts.seed,
        device=check_device(args.device),
        progress=not args.quiet,
        **maps,
    )


def run(args: argparse.Namespace) -> int:
    from ..core.provenance import display_path
    from ..interventions import figures as intervention_figures
    from ..io.formats import load_checkpoint

    target = output_target(args, "ablate", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)
    result = interventions_from_args(args, ckpt, recipe, recipe.interventions, ("ablate",))
    assert result.ablation is not None  # ablate=True
    with writing(target) as out:
        result.ablation.to_csv(out / "ablation.csv", index=False)
        intervention_figures.ablation(result.ablation, out / "ablation")
        (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str) + "\n")
        write_run(out, {"command": "ablate", "checkpoint": display_path(ckpt.path)})
    entry = result.summary["ablation"]
    print(f"error / d at {entry['n_examples']} examples: unablated {entry['baseline_error']:.4f}")
    print("layer skipped: " + " ".join(f"L{l} {e:.3f}" for l, e in zip(entry["skip"]["layer"], entry["skip"]["error"])))
    for row in entry["most_harmful"]:
        where = f"L{row['layer']}.H{row['head']}" if row["component"] == "head" else f"L{row['layer']}.MLP"
        print(f"  {where} {row['kind']}: +{row['increase']:.3f}")
    print(f"wrote {target.path}")
    return 0
