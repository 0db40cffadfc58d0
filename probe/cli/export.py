"""Write a checkpoint in another code base's layout. Today: Garg et al.'s run directory
(config.yaml + state.pt), which their code and the Iterative Newton paper's fork load, evaluate
(`eval.get_run_metrics`) and continue training from (`train.py` resumes state.pt).

examples:
  icl-probe export checkpoints/gpt2-default --to garg --out exports/gpt2-default
"""

from __future__ import annotations

import argparse

from ..models import family_class
from .common import add_out, writing

LAYOUTS = ("garg",)


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="run directory to export")
    p.add_argument("--to", default="garg", help="target layout (default garg; known: garg)")
    add_out(p, "run directory to write")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import ConfigError
    from ..core.registry import unknown_name_message
    from ..io.checkpoint import export_garg, safe_torch_load
    from ..io.formats import load_checkpoint
    from ..io.outputs import check_run_output

    if args.to not in LAYOUTS:
        raise ConfigError(unknown_name_message("export layout", args.to, list(LAYOUTS)))
    ckpt = load_checkpoint(args.checkpoint)
    target = check_run_output(args.out, "export", force=args.force, inputs=(ckpt.path,))
    assert target is not None  # --out is required
    from ..training.train import TRAIN_STATE, estimated_adam_state, learning_rate

    step = int(ckpt.meta.get("train_step", 0))
    # their Adam continues where our schedule had arrived (its last rate for a finished run), with
    # our moments where the run's optimizer state is there (a user's own run)
    lr = learning_rate(ckpt.config, max(step - 1, 0)) if ckpt.format == "icl-probe" else None
    saved = ckpt.path / TRAIN_STATE
    optimizer = safe_torch_load(saved).get("optimizer") if ckpt.format == "icl-probe" and saved.is_file() else None
    if optimizer is None and ckpt.format == "icl-probe" and family_class(ckpt.config.model.family).garg_format:
        # no moments kept (a shipped checkpoint): estimate them, so that their Adam resumes smoothly
        optimizer = estimated_adam_state(ckpt.model, ckpt.config, step)
    with writing(target) as staged:
        export_garg(
            ckpt.model,
            ckpt.config,
            staged,
            train_step=step,
            run_name=ckpt.path.name,
            out_dir=target.path.name,  # the directory's own name, not the staging directory's
            lr=lr,
            optimizer_state=optimizer,
        )
    print(f"{ckpt.path} exported to {target.path} in Garg et al.'s layout (config.yaml, state.pt)")
    if lr is not None and lr != ckpt.config.train.lr:
        print(
            f"config.yaml's training.learning_rate is {lr:.3g}: the rate this run's schedule had reached at step "
            f"{step} (its peak: {ckpt.config.train.lr:g}), so their train.py continues where this run stopped"
        )
    return 0
