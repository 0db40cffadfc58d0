"""Per-layer readout retraining (Fu et al. 2024, §4.1): a fresh linear read-out on every frozen layer,
fitted on training prompts and scored on held-out prompts (error / d per layer and examples).

examples:
  icl-probe readout checkpoints/gpt2-default --out reports/readout
  icl-probe readout checkpoints/lstm-default --out reports/readout-lstm --readout-method adam
"""

from __future__ import annotations

import argparse

from .common import output_target, writing
from .layers import add_layer_args, settings_from_args, write_tables


def add_parser(p: argparse.ArgumentParser) -> None:
    add_layer_args(p, simw=False)


def run(args: argparse.Namespace) -> int:
    from ..analysis.pipeline import analyse_layers
    from ..core.provenance import display_path
    from ..io.formats import load_checkpoint
    from ..reporting import figures

    target = output_target(args, "readout", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    settings = settings_from_args(args, ckpt, sweeps=(), similarity={"simw": False})
    result = analyse_layers(ckpt.model, ckpt.config.task, settings, progress=not args.quiet)
    summary = result.readout[result.readout.n_examples >= 1].groupby("layer").error.mean().reset_index()
    with writing(target) as out:
        write_tables(
            out,
            {"readout": result.readout, "readout_by_layer": summary},
            {"command": "readout", "checkpoint": display_path(ckpt.path), "settings": settings.__dict__},
        )
        figures.readout_error(result.readout, out / "readout", ckpt.config.task.n_dims)
    print("mean error / d over examples >= 1, per layer:")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {target.path}")
    return 0
