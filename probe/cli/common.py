"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
import contextlib
import shutil
from pathlib import Path

from ..core.errors import ConfigError


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")


def check_device(device: str) -> str:
    from ..core.validate import check_device as check

    try:
        return check(device)
    except ConfigError as err:
        raise ConfigError(f"--{err}") from None


def _flag_value(text: str, rule, expected: str):
    """argparse type: the text as an integer, then probe/core/validate.py's `rule` for it (one rule
    for a flag, a recipe key and an API argument); a fault reads "expected <expected>, got <text>"."""
    try:
        return rule(int(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type of a count flag: an integer >= 1."""
    from ..core.validate import positive_int as rule

    return _flag_value(text, lambda value: rule(value, "value"), "a positive integer")


def seed(text: str) -> int:
    """argparse type of a --seed flag: an integer in 0..2^63-1."""
    from ..core.validate import check_seed

    return _flag_value(text, check_seed, "a seed, an integer in 0..2^63-1")


def add_out(parser: argparse.ArgumentParser, help_text: str, required: bool = True) -> None:
    """`--out` and `--force`, with the output policy of probe.io.outputs."""
    parser.add_argument("--out", required=required, help=help_text)
    parser.add_argument(
        "--force",
        action="store_true",
        help="also write into a directory holding other files (kept) or another command's "
        "output; never the input, a parent of it, or a symlink",
    )


def output_target(
    args: argparse.Namespace, command: str, inputs: tuple = (), kind: str = "dir", out: str | Path | None = None
):
    """Check `--out` against the output policy before any work; None when no --out was given."""
    from ..io.outputs import OutputTarget

    path = out if out is not None else args.out
    if path is None:
        return None
    return OutputTarget(
        Path(path), command, kind, bool(getattr(args, "force", False)), tuple(Path(p) for p in inputs if p)
    )


@contextlib.contextmanager
def writing(target, record: dict | None = None):
    """Yield a staging directory; publish it into `target` only if the block succeeds."""
    staged = target.stage()
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    target.publish(staged, record)
