"""Write a transformer whose weights implement a known learner (ground truth for the analyses):
each layer one step of gradient descent (von Oswald et al. 2023), Iterative Newton with linear
attention and two layers per iteration (`newton`), Fu et al. 2024, Thm. 1's ReLU-attention
construction with one layer per iteration (`newton-relu`), or one of Hataya & Imaizumi 2024's stochastic
constructions: minibatch SGD with seeded masks (`sgd`, Thm. 4), a random number from the data
(`uniform`, Thm. 2) and an xorshift32 generator block (`prng`, Thm. 3). The result is an
icl-probe checkpoint.

examples:
  icl-probe planted --algorithm gd --layers 6 --out checkpoints/planted/gd
  icl-probe report checkpoints/planted/gd
  icl-probe planted --algorithm newton --layers 13 --dims 4 --points 16 --out /tmp/newton
  icl-probe planted --algorithm newton-relu --layers 8 --out /tmp/newton-relu
  icl-probe planted --algorithm sgd --layers 6 --batch 4 --seed 0 --out checkpoints/planted/sgd
  icl-probe planted --algorithm uniform --layers 1 --eps 0.05 --out /tmp/uniform
  icl-probe planted --algorithm prng --layers 1 --dims 32 --points 4 --out /tmp/prng
"""

from __future__ import annotations

import argparse

from .common import add_out, positive_int, seed, writing

MAX_LAYERS = 10_000  # a planted model is analysed layer by layer; deeper ones are never useful
MAX_DIMS = 1024
MAX_POINTS = 4096


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--algorithm", required=True, help="the construction: gd, newton, newton-relu, sgd, adam, uniform or prng"
    )
    p.add_argument(
        "--layers",
        type=int,
        required=True,
        help="number of layers (newton: 3 + 2 per iteration; newton-relu: 2 + 1 per iteration)",
    )
    p.add_argument(
        "--step-size", type=float, default=None, help="GD step eta, paper convention (default 1/(1+sqrt d)^2)"
    )
    p.add_argument(
        "--alpha", type=float, default=None, help="Newton's fixed M_0 = alpha S/t (default 1/(2(1+sqrt d)^2)^2)"
    )
    p.add_argument("--batch", type=int, default=4, help="sgd: minibatch size K (default 4)")
    p.add_argument("--seed", type=seed, default=0, help="sgd: seed of the minibatch masks (default 0)")
    p.add_argument("--eps", type=float, default=0.05, help="uniform: ramp half-width eps of the CDF (default 0.05)")
    p.add_argument("--outputs", type=int, default=4, help="prng: numbers M the block emits (default 4)")
    p.add_argument("--dims", type=positive_int, default=4, help="d (default 4)")
    p.add_argument("--points", type=positive_int, default=16, help="examples per prompt (default 16)")
    add_out(p, "checkpoint directory to write")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import ConfigError
    from ..models.constructions import CONSTRUCTIONS

    CONSTRUCTIONS.get(args.algorithm)  # unknown name -> close-match suggestion
    if not 1 <= args.layers <= MAX_LAYERS:
        raise ConfigError(f"--layers must be an integer in 1..{MAX_LAYERS}, got {args.layers}")
    if args.dims > MAX_DIMS or args.points > MAX_POINTS:
        raise ConfigError(
            f"--dims must be <= {MAX_DIMS} and --points <= {MAX_POINTS}, got {args.dims} and {args.points}"
        )
    from ..io.outputs import check_run_output
    from ..io.planted_io import write_planted

    target = check_run_output(args.out, "planted", force=args.force)
    assert target is not None  # --out is required
    with writing(target) as staged:
        write_planted(
            args.algorithm,
            args.layers,
            args.dims,
            args.points,
            staged,
            step_size=args.step_size,
            alpha=args.alpha,
            eps=args.eps,
            batch=args.batch,
            seed=args.seed,
            outputs=args.outputs,
        )
    print(f"planted {args.algorithm} model with {args.layers} layers written to {target.path}")
    return 0
