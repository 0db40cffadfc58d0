"""Arguments and outputs shared by the layer-analysis commands (readout, heatmap, span)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import DEFAULT_CHECKPOINT, add_device, add_out, check_device, positive_int


def add_layer_args(p: argparse.ArgumentParser, simw: bool = True) -> None:
    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)")
    add_out(p, "directory for CSV tables and PNG/SVG figures")
    p.add_argument("--train-prompts", type=positive_int, default=2048, help="prompts to fit read-outs (default 2048)")
    p.add_argument("--val-prompts", type=positive_int, default=512, help="prompts to pick the ridge penalty (default 512)")
    p.add_argument("--eval-prompts", type=positive_int, default=512, help="held-out prompts (default 512)")
    p.add_argument("--readout-method", choices=["ridge", "adam", "model"], default="ridge",
                   help="closed-form ridge (default), ridge fine-tuned by Adam, or the model's own read-out (model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=positive_int, default=1000, help="bootstrap resamples for intervals")
    if simw:
        p.add_argument("--simw-prompts", type=positive_int, default=128, help="prompts for SimW / span (default 128)")
        p.add_argument("--queries", type=int, default=0, help="fresh queries per prefix for SimW (default 4d)")
    add_device(p)


def settings_from_args(args: argparse.Namespace, **overrides):
    from ..analysis.pipeline import LayerSettings

    values = dict(n_train=args.train_prompts, n_val=args.val_prompts, n_eval=args.eval_prompts, seed=args.seed,
                  readout_method=args.readout_method, n_boot=args.bootstrap, device=check_device(args.device))
    if hasattr(args, "simw_prompts"):
        values.update(n_simw=min(args.simw_prompts, args.eval_prompts), n_queries=args.queries)
    else:
        values.update(n_simw=min(LayerSettings.n_simw, args.eval_prompts))
    values.update(overrides)
    return LayerSettings(**values)


def write_tables(out: Path, tables: dict, meta: dict) -> None:
    from ..provenance import stamp

    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    (out / "run.json").write_text(json.dumps({**meta, **stamp()}, indent=2, default=str) + "\n")
