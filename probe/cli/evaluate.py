"""Squared error / d against the number of in-context examples, beside least squares,
3-nearest neighbours and averaging, with a bootstrap 5-95% band for the model.

examples:
  icl-probe evaluate checkpoints/gpt2-default
  icl-probe evaluate checkpoints/gpt2-default --prompts 1280 --seed 0 --out /tmp/eval
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import DEFAULT_CHECKPOINT, add_device, check_device, positive_int


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT),
                   help="run directory (default: the shipped default checkpoint)")
    p.add_argument("--prompts", type=positive_int, default=1280, help="number of evaluation prompts (default 1280)")
    p.add_argument("--points", type=positive_int, default=None, help="examples per prompt (default: the training task's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation prompts and bootstrap (default 0)")
    p.add_argument("--out", help="directory for eval.csv, eval.png and eval.json")
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import load_checkpoint
    from ..errors import ConfigError
    from ..evaluate import error_curve, plot_error_curve
    from ..provenance import stamp

    device = check_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    if args.points and args.points > ckpt.config.model.n_positions:
        raise ConfigError(f"--points {args.points} exceeds the model's {ckpt.config.model.n_positions} positions")
    frame = error_curve(ckpt.model, ckpt.config.task, args.prompts, args.seed, args.points, device=device,
                        progress=not args.quiet)
    print(f"{ckpt.path} ({ckpt.format}, {ckpt.config.task.name}, d={ckpt.config.task.n_dims}); "
          f"squared error / d over {args.prompts} prompts, seed {args.seed}")
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "eval.csv", index=False)
        plot_error_curve(frame, out / "eval.png", title=f"{ckpt.path.name}: error vs in-context examples")
        record = {"checkpoint": str(ckpt.path), "format": ckpt.format, "prompts": args.prompts, "seed": args.seed,
                  "points": args.points, "task": ckpt.config.task.__dict__, **stamp()}
        (out / "eval.json").write_text(json.dumps(record, indent=2, default=list) + "\n")
        print(f"wrote {out / 'eval.csv'} and {out / 'eval.png'}")
    return 0
