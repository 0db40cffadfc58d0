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

from ..core.config import to_dict
from .stage import add_stage_parser, run_stage


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import OrderSettings

    add_stage_parser(p, "order", OrderSettings, "order.csv, order_summary.json and order.png", {"seed": "seed"})


def run(args: argparse.Namespace) -> int:
    from ..reporting.schema import to_json
    from ..reporting.summary import order_block

    def show(table) -> None:
        for rows, index in ((table.predictor == "model", "layer"), (table.predictor != "model", "predictor")):
            view = table[rows].pivot(index=index, columns="prefix", values="sensitivity")
            print(view.to_string(float_format=lambda v: f"{v:.3g}"))

    return run_stage(
        args,
        "order",
        "order",
        summary=lambda table, data: {"order_sensitivity": to_json(order_block(table))},
        record=lambda ckpt, r: {**to_dict(r.order), "seed": r.prompts.seed, "readout": to_dict(r.readout)},
        show=show,
        # refuse prefixes without a query before any work
        check=lambda ckpt, r: r.order.prefixes_for(ckpt.config.task.n_dims, ckpt.config.task.n_points),
    )
