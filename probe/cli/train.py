"""Train a model from a TOML recipe; `--set section.key=value` overrides single values.

examples:
  icl-probe train --recipe recipes/gpt2-default.toml --out checkpoints/gpt2-default
  icl-probe train --recipe recipes/tiny.toml --set train.steps=50 --out /tmp/run
  icl-probe train --out /tmp/run --resume        # continue a killed run
  icl-probe train --recipe recipes/gpt2-default.toml --keep-every 1000 --out /tmp/run  # with snapshots
  icl-probe train --recipe recipes/gpt2-d8.toml --keep-at 500,900,1600,2900 --out /tmp/run  # snapshots at these steps
  torchrun --nproc_per_node 2 -m probe train --recipe recipes/tiny.toml --out /tmp/ddp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import add_device, add_out, check_device


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipe",
        help="TOML recipe with [model] [task] [train] [curriculum] tables: a path, or a shipped recipe's name (tiny)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one recipe value, e.g. train.steps=500 (repeatable)",
    )
    add_out(p, "run directory to write")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--keep-every",
        type=int,
        default=0,
        metavar="N",
        help="also keep an immutable snapshot every N steps under OUT/snapshots/step_<k>/",
    )
    p.add_argument(
        "--keep-at",
        type=_step_list,
        default=(),
        metavar="K1,K2,...",
        help="also keep a snapshot at each of these step counts (e.g. log-spaced: 500,900,1600,...)",
    )
    add_device(p)


def _step_list(text: str) -> tuple[int, ...]:
    """`--keep-at 500,900,1600`: comma-separated positive step counts."""
    try:
        steps = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of step counts, e.g. 500,1000"
        ) from None
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: step counts are positive whole numbers, e.g. 500,1000")
    return steps


def run(args: argparse.Namespace) -> int:
    from ..core.config import load_recipe, merge, parse_override
    from ..core.errors import ConfigError
    from ..core.resources import training_recipe
    from ..io.outputs import check_run_output, remove_previous
    from ..io.run_config import RunConfig

    out = Path(args.out)
    target = check_run_output(out, "train", resume=args.resume, force=args.force)
    if args.resume and not args.recipe and (out / "config.json").is_file():
        data = _saved_config(out)
    elif args.recipe:
        data = load_recipe(training_recipe(args.recipe))
    else:
        data = {}
    for text in args.set:
        data = merge(data, parse_override(text))
    cfg = RunConfig.from_dict(data)
    if args.resume and (out / "config.json").is_file():
        saved = _saved_config(out)
        if saved != cfg.to_dict():
            raise ConfigError(
                f"--resume: the config given differs from the one {out} was trained with; "
                "drop --recipe/--set to resume with the saved config"
            )
    from ..training.train import train

    device = check_device(args.device)
    if target is not None:
        remove_previous(target)
    train(
        cfg,
        out,
        resume=args.resume,
        device=device,
        progress=not args.quiet,
        keep_every=args.keep_every,
        keep_at=args.keep_at,
    )
    print(f"trained model written to {out}")
    return 0


def _saved_config(out: Path) -> dict:
    from ..core.errors import CheckpointError

    try:
        data = json.loads((out / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{out / 'config.json'}: unreadable run config ({err}); pass --recipe to resume"
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f'{out / "config.json"}: "config" must be an object')
    return data
