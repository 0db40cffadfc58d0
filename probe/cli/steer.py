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
import json

from ..resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, positive_int, writing

DEFAULT_PREFIXES = "d, 2d+1 and n-1"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (a transformer)")
    add_out(p, "directory for steering.csv, steering_summary.json and steering.png")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer boundaries to edit (default: all)")
    p.add_argument(
        "--prefixes", type=int, nargs="+", default=None, help=f"examples before the query (default: {DEFAULT_PREFIXES})"
    )
    p.add_argument("--targets", nargs="+", default=["w_ols", "xty"], help="probe targets: w_ols, xty")
    p.add_argument("--train-prompts", type=positive_int, default=1024, help="prompts the probes are fitted on")
    p.add_argument("--test-prompts", type=positive_int, default=128, help="prompts that are steered")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts, deltas and probes")
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..formats import load_checkpoint
    from ..interventions.steer import check_cells, steering_summary, steering_table
    from ..provenance import stamp
    from ..report import figures
    from ..seeds import Stream, stream_generator
    from ..tasks import sample_prompts

    target = output_target(args, "steer", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    model, task = ckpt.model, ckpt.config.task
    if getattr(model, "runner", None) is None:
        raise ConfigError(
            f"steering edits a transformer's residual stream; this checkpoint is a {ckpt.config.model.family} model "
            "(use a GPT-2 family or planted checkpoint)"
        )
    d, n = task.n_dims, task.n_points
    layers = args.layers if args.layers is not None else list(range(ckpt.config.model.n_layer + 1))
    prefixes = args.prefixes or sorted({min(t, n - 1) for t in (d, 2 * d + 1, n - 1)})
    check_cells(model, layers, prefixes, tuple(args.targets), n)
    device = check_device(args.device)
    train, test = (
        sample_prompts(task, size, generator=stream_generator(args.seed, stream))
        for size, stream in ((args.train_prompts, Stream.STEER_TRAIN), (args.test_prompts, Stream.STEER_TEST))
    )
    table = steering_table(
        model,
        (train.xs, train.ys),
        (test.xs, test.ys),
        layers,
        prefixes,
        tuple(args.targets),
        seed=args.seed,
        device=device,
    )
    settings = {
        "layers": layers,
        "prefixes": prefixes,
        "targets": args.targets,
        "train_prompts": args.train_prompts,
        "test_prompts": args.test_prompts,
        "seed": args.seed,
    }
    with writing(target) as out:
        table.to_csv(out / "steering.csv", index=False)
        (out / "steering_summary.json").write_text(
            json.dumps({"steering": steering_summary(table), "settings": settings, **stamp()}, indent=2, default=str)
            + "\n"
        )
        figures.steering(table, out / "steering")
    view = table.pivot_table(index=["target", "edit", "layer"], columns="prefix", values="slope")
    print(view.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {target.path}")
    return 0
