"""Write a transformer whose weights implement a known learner (ground truth for the analyses):
each layer one step of gradient descent (von Oswald et al. 2023), or Iterative Newton with two
layers per iteration (seed 003 Thm. 1 style). The result is an icl-probe checkpoint.

examples:
  icl-probe planted --algorithm gd --layers 6 --out checkpoints/planted/gd
  icl-probe report checkpoints/planted/gd
  icl-probe planted --algorithm newton --layers 13 --dims 4 --points 16 --out /tmp/newton
"""

from __future__ import annotations

import argparse

from .common import positive_int

ALGORITHMS = ("gd", "newton")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", required=True, help="gd or newton")
    p.add_argument("--layers", type=int, required=True, help="number of layers (newton: 3 + 2 per iteration)")
    p.add_argument("--step-size", type=float, default=None, help="GD step eta, paper convention (default 1/(1+sqrt d)^2)")
    p.add_argument("--alpha", type=float, default=None, help="Newton's fixed M_0 = alpha S/t (default 1/(2(1+sqrt d)^2)^2)")
    p.add_argument("--dims", type=positive_int, default=4, help="d (default 4)")
    p.add_argument("--points", type=positive_int, default=16, help="examples per prompt (default 16)")
    p.add_argument("--out", required=True, help="checkpoint directory to write")


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..registry import unknown_name_message

    if args.algorithm not in ALGORITHMS:
        raise ConfigError(unknown_name_message("planted algorithm", args.algorithm, list(ALGORITHMS)))
    if args.layers < 1:
        raise ConfigError(f"--layers must be a positive integer, got {args.layers}")
    from ..planted_io import write_planted

    path = write_planted(args.algorithm, args.layers, args.dims, args.points, args.out,
                         step_size=args.step_size, alpha=args.alpha)
    print(f"planted {args.algorithm} model with {args.layers} layers written to {path}")
    return 0
