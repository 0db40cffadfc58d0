"""Order sensitivity (seed 000, Discussion): permute the examples of each prompt (same query) and
measure per layer how much the read-out prediction moves, as a share of its variance across
prompts, beside reference learners (0 for least squares, ridge, GD, Newton; positive for online
GD and SGD with fixed minibatch positions). The report's [order] stage, on its own.

examples:
  icl-probe order checkpoints/gpt2-default --out reports/order
  icl-probe order checkpoints/lstm-default --out /tmp/order-lstm --permutations 16 --prefixes 4 9 15
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
    from ..settings import OrderSettings, PromptSettings, add_flags

    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory")
    add_out(p, "directory for order.csv, order_summary.json and order.png")
    add_flags(
        p, "order", OrderSettings, [f.name for f in fields(OrderSettings) if f.name not in ("enabled", "learners")]
    )
    add_flags(p, "prompts", PromptSettings, {"seed": "seed"})
    add_recipe_args(p)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..formats import load_checkpoint
    from ..provenance import stamp
    from ..report import figures
    from ..report.build import order_stage
    from ..report.schema import to_json
    from ..report.summary import order_block

    target = output_target(args, "order", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)  # the report's settings, then the flags
    task = ckpt.config.task
    recipe.order.prefixes_for(task.n_dims, task.n_points)  # refuse prefixes without a query before any work
    tables, _ = order_stage(ckpt, recipe, check_device(args.device), None)
    table = tables["order"]
    record = {**to_dict(recipe.order), "seed": recipe.prompts.seed, "readout": to_dict(recipe.readout)}
    with writing(target) as out:
        table.to_csv(out / "order.csv", index=False)
        (out / "order_summary.json").write_text(
            json.dumps(
                {"order_sensitivity": to_json(order_block(table)), "settings": record, **stamp()}, indent=2, default=str
            )
            + "\n"
        )
        figures.order_sensitivity(table, out / "order")
    print(
        table[table.predictor == "model"]
        .pivot(index="layer", columns="prefix", values="sensitivity")
        .to_string(float_format=lambda v: f"{v:.3g}")
    )
    print(
        table[table.predictor != "model"]
        .pivot(index="predictor", columns="prefix", values="sensitivity")
        .to_string(float_format=lambda v: f"{v:.3g}")
    )
    print(f"wrote {target.path}")
    return 0
