"""Show a checkpoint's format, shape and a quick in-distribution error.

examples:
  icl-probe inspect checkpoints/gpt2-default
  icl-probe inspect path/to/garg/run --json
"""

from __future__ import annotations

import argparse
import json

from ..core.resources import DEFAULT_CHECKPOINT
from ..models import family_class
from .common import positive_int


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--prompts", type=positive_int, default=256, help="prompts for the quick error (default 256)")


def run(args: argparse.Namespace) -> int:
    from ..analysis.evaluate import eval_prompts, predict
    from ..core import budget
    from ..data.metrics import error_per_dim
    from ..io.formats import load_checkpoint
    from ..models.sizes import shape_of

    ckpt = load_checkpoint(args.checkpoint)
    m, task = ckpt.config.model, ckpt.config.task
    budget.check([budget.prompt_estimate("prompts", args.prompts, shape_of(ckpt.model), task.n_points)])
    prompts = eval_prompts(task, args.prompts, seed=0)
    err = error_per_dim(predict(ckpt.model, prompts), prompts.ys, task.n_dims).mean(0)
    k = 2 * task.n_dims + 1
    info = {
        "path": str(ckpt.path),
        "format": ckpt.format,
        "family": m.family,
        "n_dims": m.n_dims,
        "n_layer": m.n_layer,
        "n_embd": m.n_embd,
        "n_head": m.n_head if family_class(m.family).attention_heads else None,
        "n_positions": m.n_positions,  # the model's positions (x and y tokens each)
        "task_points": task.n_points,  # examples per prompt the task draws (Garg: the curriculum's end)
        "encoding": m.encoding,
        "parameters": sum(p.numel() for p in ckpt.model.parameters()),
        "task": task.name,
        "covariance": task.covariance,
        "train_step": ckpt.meta.get("train_step"),
        "error_mean": float(err.mean()),
        "error_at_2d1": float(err[k]) if k < err.numel() else None,
        "error_prompts": args.prompts,
        "sha256": ckpt.sha256,
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        width = max(map(len, info))
        for key, value in info.items():
            print(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0
