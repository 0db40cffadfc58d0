"""Squared error / d against the number of in-context examples, beside least squares,
3-nearest neighbours and averaging, with a bootstrap 5-95% band for the model.
For ReLU-network tasks: R^2 (scikit-learn's, over prompts, per number of examples) beside
training the N-layer network directly on each prompt's examples (Wu et al. 2024, App. G).
Shifts: --mixture (input mixture weights), --param-mean (network parameter mean),
--points beyond the training length (ReLU tasks); --shift NAME[=VALUE], Garg et al.'s
evaluation prompt families for isotropic linear regression (probe/data/shifts.py: random_quadrants,
opposite_quadrants, orthogonal_train_test, overlapping_train_test, half_subspace, skewed,
scale_x=S, scale_y=S, noisy=SIGMA), every baseline asked the same shifted queries; with --track,
which reference learner (each at its member matched to the model in distribution) the model
tracks under the shift (probe/analysis/shift_tracking.py).

examples:
  icl-probe evaluate checkpoints/gpt2-default
  icl-probe evaluate checkpoints/gpt2-default --prompts 1280 --seed 0 --out /tmp/eval
  icl-probe evaluate checkpoints/gpt2-relu3 --mixture 0.7,0.3 --param-mean 0.5 --points 32
  icl-probe evaluate checkpoints/gpt2-default --shift scale_x=3 --out /tmp/eval-scale3
  icl-probe evaluate checkpoints/planted/gd --shift scale_x=3 --track
"""

from __future__ import annotations

import argparse
import json

from ..core.resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, positive_int, seed, writing


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        nargs="?",
        default=str(DEFAULT_CHECKPOINT),
        help="run directory (default: the shipped default checkpoint)",
    )
    p.add_argument("--prompts", type=positive_int, default=1280, help="number of evaluation prompts (default 1280)")
    p.add_argument(
        "--points", type=positive_int, default=None, help="examples per prompt (default: the training task's)"
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the evaluation prompts and bootstrap (default 0)")
    add_out(p, "directory for eval.csv, eval.png and eval.json", required=False)
    p.add_argument("--mixture", help="input mixture weights w1,w2 of w1 N(-2,I) + w2 N(2,I) (ReLU tasks)")
    p.add_argument("--param-mean", type=float, help="mean of the network parameters (ReLU tasks)")
    p.add_argument(
        "--shift",
        metavar="NAME[=VALUE]",
        help="one of Garg et al.'s evaluation prompt families (linear tasks; probe/data/shifts.py)",
    )
    p.add_argument(
        "--track",
        action="store_true",
        help="with --shift: which reference learner the model tracks under the shift, each at the member matched "
        "to the model in distribution (probe/analysis/shift_tracking.py); writes track.csv",
    )
    p.add_argument("--epochs", type=positive_int, default=100, help="direct-training epochs (ReLU tasks, default 100)")
    p.add_argument(
        "--direct-prompts",
        type=positive_int,
        default=256,
        help="prompts the direct-training baseline runs on (ReLU tasks, default 256)",
    )
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.evaluate import plot_error_curve
    from ..core.errors import ConfigError
    from ..io.formats import load_checkpoint

    device = check_device(args.device)
    target = output_target(args, "evaluate", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    if args.points and args.points > ckpt.config.model.n_positions:
        raise ConfigError(f"--points {args.points} exceeds the model's {ckpt.config.model.n_positions} positions")
    task = shifted_task(ckpt.config.task, args)
    if args.track and args.shift is None:
        raise ConfigError("--track compares learners under a shift: give --shift NAME[=VALUE] too")
    frame, metric, tracking = _curve(ckpt, task, args, device)
    print(
        f"{ckpt.path} ({ckpt.format}, {task.name}, d={task.n_dims}); {metric} over {args.prompts} prompts, seed {args.seed}"
    )
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if tracking is not None:
        from ..analysis.shift_tracking import tracking_words

        print(tracking.table.drop(columns="shift").to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(tracking_words(tracking))
    if target is not None:
        with writing(target) as out:
            frame.to_csv(out / "eval.csv", index=False)
            if tracking is not None:
                tracking.table.to_csv(out / "track.csv", index=False)
            plot_error_curve(frame, out / "eval.png", title=f"{ckpt.path.name}: error vs in-context examples")
            record = _record(ckpt, task, args, metric, tracking)
            (out / "eval.json").write_text(json.dumps(record, indent=2, default=list) + "\n")
        print(f"wrote {target.path / 'eval.csv'} and {target.path / 'eval.png'}")
    return 0


def _curve(ckpt, task, args: argparse.Namespace, device: str):
    """(the error or R^2 curve, its metric's words, the shift tracking or None) the flags ask for."""
    from ..analysis.evaluate import error_curve, r2_curve
    from ..core.errors import ConfigError

    if args.shift is not None:
        from ..analysis.evaluate import shifted_error_curve
        from ..data.shifts import parse_shift

        parse_shift(args.shift)  # a bad name or value is refused before any work
        if task.name != "linear_regression" or task.covariance != "isotropic":
            raise ConfigError(f"--shift applies to isotropic linear regression; this checkpoint's task is {task.name}")
        frame = shifted_error_curve(ckpt.model, task, args.shift, None, args.prompts, args.seed, args.points, device)
        tracking = None
        if args.track:
            from ..analysis.shift_tracking import track_under_shift

            tracking = track_under_shift(ckpt.model, task, args.shift, args.prompts, args.seed, device)
        return frame, f"squared error / d under {frame['shift'].iloc[0]}", tracking
    if task.name == "relu_network":
        frame = r2_curve(
            ckpt.model,
            task,
            args.prompts,
            args.seed,
            args.points,
            device=device,
            epochs=args.epochs,
            direct_prompts=args.direct_prompts,
            progress=not args.quiet,
        )
        return frame, "R^2", None
    frame = error_curve(ckpt.model, task, args.prompts, args.seed, args.points, device=device, progress=not args.quiet)
    return frame, "squared error / d", None


def _record(ckpt, task, args: argparse.Namespace, metric: str, tracking) -> dict:
    """eval.json: what was evaluated, how, the tracking's answer, the task and provenance."""
    from ..core.provenance import display_path, stamp

    track = None
    if tracking is not None:
        best = tracking.best
        track = {
            "tracks": tracking.tracks,
            "runner_up": tracking.runner_up,
            "criterion": best.criterion,
            "difference": best.difference,
            "ci_low": best.low,
            "ci_high": best.high,
            "separable": tracking.separable,
        }
    return {
        "checkpoint": display_path(ckpt.path),
        "format": ckpt.format,
        "prompts": args.prompts,
        "seed": args.seed,
        "points": args.points,
        "metric": metric,
        "shift": args.shift,
        "track": track,
        "task": task.__dict__,
        **stamp(),
    }


def shifted_task(task, args: argparse.Namespace):
    """The checkpoint's task with the requested distribution shifts applied."""
    import dataclasses

    from ..core.errors import ConfigError

    changes = {}
    if args.mixture is not None:
        try:
            changes["mixture_weights"] = tuple(float(v) for v in args.mixture.split(","))
        except ValueError:
            raise ConfigError(f"--mixture must look like 0.9,0.1, got {args.mixture!r}") from None
    if args.param_mean is not None:
        changes["param_mean"] = args.param_mean
    if changes and task.name != "relu_network":
        raise ConfigError("--mixture and --param-mean apply to ReLU-network tasks only")
    if args.points:
        changes["n_points"] = args.points
    return dataclasses.replace(task, **changes) if changes else task
