"""Capture predictions and activations for prompts in an .npz file.

PROMPTS.npz must hold xs (B, n, d) and ys (B, n), float; other arrays are ignored. OUT.npz gets
`pred` (B, n) and `resid` (layers+1, B, 2n, width): the embedding output and the raw residual
stream after each block, before any final LayerNorm; plus each --hooks name asked for
(e.g. ln_final.hook_normalized, blocks.0.attn.hook_pattern).

examples:
  icl-probe capture checkpoints/gpt2-default --prompts prompts.npz --out acts.npz
  icl-probe capture checkpoints/gpt2-default --prompts prompts.npz --out acts.npz --hooks blocks.2.attn.hook_pattern
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_device, check_device, positive_int


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="run directory")
    p.add_argument("--prompts", required=True, help=".npz with xs (B, n, d) and ys (B, n)")
    p.add_argument("--out", required=True, help="output .npz")
    p.add_argument("--hooks", nargs="*", default=[], help="extra TransformerLens hook names to save")
    p.add_argument("--batch-size", type=positive_int, default=256)
    add_device(p)


def load_prompts(path: str):
    import numpy as np
    import torch

    from ..errors import ConfigError

    if not Path(path).is_file():
        raise ConfigError(f"prompts file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable .npz file ({err})") from None
    missing = {"xs", "ys"} - set(data.files)
    if missing:
        raise ConfigError(f"{path}: missing arrays {sorted(missing)}; it must hold xs (B, n, d) and ys (B, n)")
    xs, ys = data["xs"], data["ys"]
    if xs.dtype.kind != "f" or ys.dtype.kind != "f":
        raise ConfigError(f"{path}: xs and ys must be float arrays, got {xs.dtype} and {ys.dtype}")
    return torch.as_tensor(xs, dtype=torch.float32), torch.as_tensor(ys, dtype=torch.float32)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..capture import RESID, capture
    from ..checkpoint import atomic_write, load_checkpoint

    device = check_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    xs, ys = load_prompts(args.prompts)
    result = capture(ckpt.model, xs, ys, hooks=[RESID, *args.hooks], batch_size=args.batch_size, device=device,
                     progress=not args.quiet)
    arrays = {"pred": result.pred, **{name: np.asarray(value) for name, value in result.acts.items()}}
    out = Path(args.out)
    atomic_write(out, lambda p: np.savez(p.open("wb"), **arrays))
    print(f"wrote {out}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in arrays.items()))
    return 0
