"""Causal probes: fit a linear attention-pooled probe of w_OLS or X^T y at each layer and prefix,
edit the stream by the smallest change that moves what the probe decodes by a random delta, run
the remaining layers, and measure whether the prediction moves as the decoded quantity says
(x . delta for w_OLS; x . S^+ delta for X^T y, least squares' map), beside a random edit of the
same size. Slope 1: the layers use what the probe reads; slope 0: the probe reads what they ignore.

examples:
  icl-probe steer checkpoints/gpt2-default --out reports/steer
  icl-probe steer checkpoints/planted/gd --out /tmp/steer-gd --layers 0 2 4 --prefixes 8
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
    from ..settings import PromptSettings, SteeringSettings, add_flags

    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (a transformer)")
    add_out(p, "directory for steering.csv, steering_summary.json and steering.png")
    add_flags(p, "steering", SteeringSettings, [f.name for f in fields(SteeringSettings) if f.name != "enabled"])
    add_flags(p, "prompts", PromptSettings, {"seed": "seed"})
    add_recipe_args(p)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..formats import load_checkpoint
    from ..interventions.steer import check_cells, steering_summary
    from ..provenance import stamp
    from ..report import figures
    from ..report.build import steering_stage

    target = output_target(args, "steer", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    if getattr(ckpt.model, "runner", None) is None:
        raise ConfigError(
            f"steering edits a transformer's residual stream; this checkpoint is a {ckpt.config.model.family} model "
            "(use a GPT-2 family or planted checkpoint)"
        )
    recipe = recipe_from_args(args, ckpt)  # the report's settings, then the flags
    task, settings = ckpt.config.task, recipe.steering
    layers, prefixes = settings.cells(ckpt.config.model.n_layer, task.n_dims, task.n_points)
    check_cells(ckpt.model, layers, prefixes, settings.targets, task.n_points)  # before any work
    table = steering_stage(ckpt, recipe, check_device(args.device))[0]["steering"]
    record = {**to_dict(settings), "layers": layers, "prefixes": prefixes, "seed": recipe.prompts.seed}
    with writing(target) as out:
        table.to_csv(out / "steering.csv", index=False)
        (out / "steering_summary.json").write_text(
            json.dumps({"steering": steering_summary(table), "settings": record, **stamp()}, indent=2, default=str)
            + "\n"
        )
        figures.steering(table, out / "steering")
    view = table.pivot_table(index=["target", "edit", "layer"], columns="prefix", values="slope")
    print(view.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {target.path}")
    return 0
