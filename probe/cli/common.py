"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "gpt2-default"


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")


def check_device(device: str) -> str:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no GPU here; use --device cpu")
    try:
        torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r} is not a torch device: {err}") from None
    return device


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
