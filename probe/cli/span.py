"""Span-of-examples test (Fu et al. 2024, App. B.4, eq. 41-42): how far each layer's induced weight
vector lies outside span{x_1..x_t}, beside a random vector's sqrt((d-t)/d) and the learners.

examples:
  icl-probe span checkpoints/gpt2-default --out reports/span
"""

from __future__ import annotations

import argparse

from .common import output_target, writing
from .layers import add_layer_args, settings_from_args, write_tables


def add_parser(p: argparse.ArgumentParser) -> None:
    add_layer_args(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.pipeline import analyse_layers
    from ..core.provenance import display_path
    from ..io.formats import load_checkpoint
    from ..reporting import figures

    target = output_target(args, "span", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    settings = settings_from_args(args, ckpt)  # every sweep of the recipe, as the report's span test
    result = analyse_layers(ckpt.model, ckpt.config.task, settings, progress=not args.quiet)
    with writing(target) as out:
        write_tables(
            out,
            {"span": result.span},
            {"command": "span", "checkpoint": display_path(ckpt.path), "settings": settings.__dict__},
        )
        figures.span(result.span, out / "span")
    d = ckpt.config.task.n_dims
    view = result.span[(result.span.kind == "layer") & (result.span.n_examples < d)]
    print(
        view.pivot_table(index="index", columns="n_examples", values="residual")
        .rename_axis("layer")
        .to_string(float_format=lambda v: f"{v:.3f}")
    )
    print("random-vector null:", {t: round(((d - t) / d) ** 0.5, 3) for t in range(1, d)})
    print(f"wrote {target.path}")
    return 0
