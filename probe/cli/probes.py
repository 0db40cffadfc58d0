"""Attention-pooled probes (seed 002 §5, App. C.8) for X^T y and w_OLS at every layer and
prefix, linear and MLP heads, with controls: the same probes on a random-weights model of the
same architecture and on shuffled targets (selectivity = score - control score).

examples:
  icl-probe probes checkpoints/gpt2-default --out reports/probes
  icl-probe probes checkpoints/gpt2-default --out /tmp/p --kinds mlp --steps 1000 --prompts 2048
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..config import to_dict
from ..resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, writing
from .layers import add_recipe_args, recipe_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..settings import ProbeSettings, PromptSettings, add_flags

    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory")
    add_out(p, "directory for probes.csv, probes_summary.json and probes.png")
    add_flags(p, "probes", ProbeSettings, [f.name for f in fields(ProbeSettings) if f.name != "enabled"])
    add_flags(p, "prompts", PromptSettings, {"test": "test-prompts", "seed": "seed"})
    add_recipe_args(p)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.probe_study import probe_study
    from ..errors import ConfigError
    from ..formats import load_checkpoint
    from ..provenance import stamp
    from ..report import figures
    from ..report.build import probe_control_model
    from ..report.schema import to_json
    from ..report.summary import probe_summary

    out_target = output_target(args, "probes", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)  # the report's settings, then the flags
    settings, seed = recipe.probes, recipe.prompts.seed
    n = ckpt.config.task.n_points
    if settings.prefixes and max(settings.prefixes) >= n:
        raise ConfigError(f"--prefixes must be below the number of points ({n}), got {list(settings.prefixes)}")
    device = check_device(args.device)
    control = probe_control_model(ckpt, seed) if settings.controls else None
    table = probe_study(
        ckpt.model, ckpt.config.task, settings, recipe.prompts.test, seed, device, control, progress=not args.quiet
    )
    summary = probe_summary(table)
    record = {**to_dict(settings), "test_prompts": recipe.prompts.test, "seed": seed}
    with writing(out_target) as out:
        table.to_csv(out / "probes.csv", index=False)
        (out / "probes_summary.json").write_text(
            json.dumps({"probes": to_json(summary), "settings": record, **stamp()}, indent=2, default=str) + "\n"
        )
        figures.probes(table, out / "probes")
    for target, kinds in summary.items():
        for kind, entry in kinds.items():
            print(
                f"{target:6s} {kind:6s} best layer {entry.best_layer}: R^2 by layer "
                + " ".join(f"{v:.2f}" for v in entry.r2)
                + "; random-model control "
                + " ".join(f"{v:.2f}" for v in entry.control_r2)
            )
    print(f"wrote {out_target.path}")
    return 0
