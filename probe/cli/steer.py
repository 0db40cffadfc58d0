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

from ..core.config import to_dict
from ..core.errors import ConfigError
from .stage import add_stage_parser, run_stage


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import SteeringSettings

    files = "steering.csv, steering_summary.json and steering.png"
    add_stage_parser(p, "steering", SteeringSettings, files, {"seed": "seed"}, " (a transformer)")


def _cells(ckpt, recipe) -> tuple[list[int], list[int]]:
    task = ckpt.config.task
    return recipe.steering.cells(ckpt.config.model.n_layer, task.n_dims, task.n_points)


def run(args: argparse.Namespace) -> int:
    from ..interventions.runner import has_runner
    from ..interventions.steer import check_cells, steering_summary

    def check(ckpt, recipe) -> None:
        if not has_runner(ckpt.model):
            raise ConfigError(
                f"steering edits a transformer's residual stream; this checkpoint is a {ckpt.config.model.family} "
                "model (use a GPT-2 family, linear self-attention or planted checkpoint)"
            )
        check_cells(ckpt.model, *_cells(ckpt, recipe), recipe.steering.targets, ckpt.config.task.n_points)

    def record(ckpt, recipe) -> dict:
        layers, prefixes = _cells(ckpt, recipe)
        return {**to_dict(recipe.steering), "layers": layers, "prefixes": prefixes, "seed": recipe.prompts.seed}

    def show(table) -> None:
        view = table.pivot_table(index=["target", "edit", "layer"], columns="prefix", values="slope")
        print(view.to_string(float_format=lambda v: f"{v:.3f}"))

    return run_stage(
        args, "steer", "steering", lambda table, data: {"steering": steering_summary(table)}, record, show, check
    )
