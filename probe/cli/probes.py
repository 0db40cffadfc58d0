"""Attention-pooled probes (seed 002 §5, App. C.8) for X^T y and w_OLS at every layer and
prefix, linear and MLP heads, with controls: the same probes on a random-weights model of the
same architecture and on shuffled targets (selectivity = score - control score).

examples:
  icl-probe probes checkpoints/gpt2-default --out reports/probes
  icl-probe probes checkpoints/gpt2-default --out /tmp/p --kinds mlp --steps 1000 --prompts 2048
"""

from __future__ import annotations

import argparse
import json

from ..resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, positive_int, writing
from .layers import add_recipe_args, recipe_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory")
    add_out(p, "directory for probes.csv, probes_summary.json and probes.png")
    p.add_argument("--kinds", nargs="+", choices=["linear", "mlp"], help="probe kinds (recipe: probes.kinds)")
    p.add_argument("--targets", nargs="+", choices=["xty", "w_ols"], help="targets (recipe: probes.targets)")
    p.add_argument("--prefixes", nargs="*", type=positive_int, help="prefix lengths t (default 1, d, 2d, n-1)")
    p.add_argument(
        "--steps",
        type=positive_int,
        help="the most Adam steps; probes stop once their validation R^2 settles (recipe: probes.steps)",
    )
    p.add_argument(
        "--lr", type=float, nargs="+", help="Adam learning rates, chosen per probe on validation (recipe: probes.lr)"
    )
    p.add_argument(
        "--hidden", type=positive_int, nargs="+", help="MLP widths, chosen the same way (recipe: probes.hidden)"
    )
    p.add_argument("--prompts", type=positive_int, help="training prompts (recipe: probes.prompts)")
    p.add_argument("--test-prompts", type=positive_int, help="held-out prompts (recipe: prompts.eval)")
    p.add_argument("--no-controls", action="store_true", help="skip the random-model and shuffled controls")
    p.add_argument("--seed", type=int, help="seed (recipe: prompts.seed)")
    add_recipe_args(p)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ..analysis.probes import probe_study, probe_summary
    from ..errors import ConfigError
    from ..formats import load_checkpoint
    from ..provenance import stamp
    from ..report import figures
    from ..report.build import probe_control_model, probe_settings

    out_target = output_target(args, "probes", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    n = ckpt.config.task.n_points
    if args.prefixes and max(args.prefixes) >= n:
        raise ConfigError(f"--prefixes must be below the number of points ({n}), got {args.prefixes}")
    recipe = recipe_from_args(args, ckpt)
    flags = {
        "kinds": args.kinds,
        "targets": args.targets,
        "steps": args.steps,
        "lr": args.lr,
        "hidden": args.hidden,
        "n_train": args.prompts,
        "n_test": args.test_prompts,
        "seed": args.seed,
        "prefixes": args.prefixes or None,
        "controls": False if args.no_controls else None,
    }
    settings = dataclasses.replace(  # the report's settings (same recipe, same numbers), then the flags
        probe_settings(recipe, check_device(args.device)),
        **{k: tuple(v) if isinstance(v, list) else v for k, v in flags.items() if v is not None},
    )
    control = probe_control_model(ckpt, settings.seed) if settings.controls else None
    table = probe_study(ckpt.model, ckpt.config.task, settings, control, progress=not args.quiet)
    summary = probe_summary(table)
    with writing(out_target) as out:
        table.to_csv(out / "probes.csv", index=False)
        (out / "probes_summary.json").write_text(
            json.dumps({"probes": summary, "settings": settings.__dict__, **stamp()}, indent=2, default=str) + "\n"
        )
        figures.probes(table, out / "probes")
    for target, kinds in summary.items():
        for kind, entry in kinds.items():
            print(
                f"{target:6s} {kind:6s} best layer {entry['best_layer']}: R^2 by layer "
                + " ".join(f"{v:.2f}" for v in entry["r2"])
                + "; random-model control "
                + " ".join(f"{v:.2f}" for v in entry["control_r2"])
            )
    print(f"wrote {out_target.path}")
    return 0
