"""Resolution ceilings of the learner comparisons (probe/analysis/resolution.py): for each pair of
reference learners and each task condition (d, condition number, label noise), how large a
difference in SimE (all t, and t >= d), or SimW, a model that is exactly one of them could show
against the other, the metric with the largest resolution and the shape of the matched-count trend
(a rate: GD with a doubling step count shows Newton's). Writes resolution.csv, resolution.png and run.json.

examples:
  icl-probe resolution --out reports/resolution
  icl-probe resolution --out /tmp/r --dims 4 8 --kappas 1 100 --noise 0 --prompts 128
"""

from __future__ import annotations

import argparse

from .common import add_device, add_out, check_device, output_target, positive_int, seed, writing


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..analysis.resolution import ResolutionGrid

    grid = ResolutionGrid()
    add_out(p, "output directory")
    p.add_argument("--dims", nargs="+", type=positive_int, default=list(grid.dims), help="input dimensions d")
    p.add_argument(
        "--kappas",
        nargs="+",
        type=_positive_float,
        default=list(grid.kappas),
        help="condition numbers of the input covariance (1: isotropic)",
    )
    p.add_argument("--noise", nargs="+", type=_positive_float, default=list(grid.noises), help="label noise std")
    p.add_argument("--prompts", type=positive_int, default=grid.prompts, help="prompts per condition")
    p.add_argument("--seed", type=seed, default=grid.seed)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.resolution import ResolutionGrid, pair_summary, resolution_table
    from ..core.errors import ConfigError
    from ..reporting import figures
    from .layers import write_tables

    if max(args.dims) * args.prompts > 200_000:
        raise ConfigError(
            f"--dims up to {max(args.dims)} with {args.prompts} prompts is more than this command "
            "sizes for (d x prompts <= 200000); lower --prompts"
        )
    device = check_device(args.device)
    target = output_target(args, "resolution")
    grid = ResolutionGrid(tuple(args.dims), tuple(args.kappas), tuple(args.noise), args.prompts, args.seed)
    table = resolution_table(grid, device, progress=not args.quiet)
    with writing(target) as out:
        write_tables(out, {"resolution": table}, {"command": "resolution", "grid": grid.__dict__})
        figures.resolution(table, out / "resolution")
    print(pair_summary(table).to_string(index=False))
    print(f"wrote {target.path}")
    return 0
