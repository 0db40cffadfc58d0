"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
import contextlib
import shutil
from pathlib import Path

from ..core.errors import ConfigError
from ..core.settings import positive_int_flag as positive_int  # noqa: F401  (the commands' argparse types)
from ..core.settings import seed_flag as seed  # noqa: F401


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")


def check_device(device: str) -> str:
    from ..core.validate import check_device as check

    try:
        return check(device)
    except ConfigError as err:
        raise ConfigError(f"--{err}") from None


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
