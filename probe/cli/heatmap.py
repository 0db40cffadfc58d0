"""Layer-vs-algorithm heatmaps (Fu et al. 2024, Def. 4, Fig. 3): SimE and SimW between every layer
(with a retrained read-out) and every reference learner over its grid, best matches with
bootstrap intervals, trend verdicts, the final layer's "Table 1" similarities and the paired
verdicts between its learners, each with its resolution (probe/analysis/verdicts.py).

examples:
  icl-probe heatmap checkpoints/gpt2-default --out reports/heatmap
  icl-probe heatmap checkpoints/gpt2-default --out /tmp/h --learners newton gd_log --no-simw
"""

from __future__ import annotations

import argparse
import json

from .common import output_target, writing
from .layers import add_layer_args, settings_from_args, write_tables


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import SimilaritySettings, add_flags

    add_layer_args(p)
    p.add_argument(
        "--learners",
        nargs="+",
        default=None,
        help="sweep labels of the recipe to run (default: all of the recipe's sweeps)",
    )
    add_flags(p, "similarity", SimilaritySettings, ["simw", "include_first"])


def run(args: argparse.Namespace) -> int:
    from ..analysis.pipeline import analyse_layers
    from ..core.provenance import display_path
    from ..io.formats import load_checkpoint
    from ..io.outputs import safe_name
    from ..reporting import figures

    target = output_target(args, "heatmap", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    labels = tuple(args.learners) if args.learners is not None else None
    settings = settings_from_args(args, ckpt, labels)
    sweeps = settings.sweeps
    result = analyse_layers(ckpt.model, ckpt.config.task, settings, progress=not args.quiet)
    with writing(target) as out:
        write_tables(
            out,
            {
                "heatmap_cells": result.cells,
                "best_match": result.best,
                "table1": result.table1,
                "verdicts": result.verdicts,
                "readout": result.readout,
            },
            {"command": "heatmap", "checkpoint": display_path(ckpt.path), "settings": settings.__dict__},
        )
        (out / "trends.json").write_text(json.dumps(result.trends, indent=2) + "\n")
        for sweep in sweeps:
            figures.heatmap_pair(
                result.cells, result.best, sweep.label, sweep.axis, out / f"heatmap_{safe_name(sweep.label)}"
            )
    print(result.best.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for t in result.trends:
        print(t["verdict"], f"[{t['metric']}]")
    print("final layer (Table 1, SimE):")
    print(result.table1.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if not result.verdicts.empty:
        print("paired verdicts (final layer; probe/analysis/verdicts.py):")
        cols = ["metric", "a", "b", "difference", "ci_low", "ci_high", "resolution", "verdict"]
        print(result.verdicts[cols].to_string(index=False, float_format=lambda v: f"{v:+.4f}"))
    print(f"wrote {target.path}")
    return 0
