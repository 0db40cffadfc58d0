"""Capture predictions and activations for prompts in an .npz file.

PROMPTS.npz must hold xs (B, n, d) and ys (B, n), float; other arrays are ignored. OUT.npz gets
`pred` (B, n) and `resid` (layers+1, B, 2n, width): the embedding output and the raw residual
stream after each block, before any final LayerNorm; plus each --hooks name asked for
(e.g. final: the stream the read-out sees; ln_final.hook_normalized: TransformerLens's
pre-affine normalised stream; blocks.0.attn.hook_pattern).

examples:
  icl-probe capture checkpoints/gpt2-default --prompts prompts.npz --out acts.npz
  icl-probe capture checkpoints/gpt2-default --prompts prompts.npz --out acts.npz --hooks blocks.2.attn.hook_pattern
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_device, add_out, check_device, output_target, positive_int, writing


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="run directory")
    p.add_argument("--prompts", required=True, help=".npz with xs (B, n, d) and ys (B, n)")
    add_out(p, "output .npz file")
    p.add_argument("--hooks", nargs="*", default=[], help="extra TransformerLens hook names to save")
    p.add_argument("--batch-size", type=positive_int, default=256)
    add_device(p)


def check_npz_headers(path: str, names: tuple[str, ...]) -> None:
    """Refuse an .npz whose array headers claim more bytes than the member holds (corrupt) or than
    memory allows, before reading the arrays."""
    import zipfile

    import numpy as np

    from ..core.errors import ConfigError
    from ..core.validate import check_memory

    with zipfile.ZipFile(path) as archive:
        for name in names:
            info = archive.getinfo(f"{name}.npy")
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(member)  # the header only, not the data
                claimed = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
                if claimed > info.file_size:
                    raise ConfigError(
                        f"{path}: array {name} claims shape {shape} ({claimed:,} bytes) but holds {info.file_size:,}: "
                        "the file is truncated or corrupt; write it again with np.savez"
                    )
                check_memory(claimed, f"{path}: array {name} of shape {shape}", "use fewer prompts per file")


def load_prompts(path: str):
    import zipfile

    import numpy as np

    from ..core.errors import ConfigError
    from ..core.validate import as_prompt_tensors
    from ..io.outputs import is_regular_file

    if not Path(path).exists():
        raise ConfigError(f"prompts file not found: {path}")
    if not is_regular_file(Path(path)):
        raise ConfigError(f"{path}: not a regular file; give an .npz with xs and ys")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ConfigError(f"{path}: a single array (.npy), not an .npz; save with np.savez(path, xs=xs, ys=ys)")
        missing = {"xs", "ys"} - set(data.files)
        if missing:
            raise ConfigError(f"{path}: missing arrays {sorted(missing)}; it must hold xs (B, n, d) and ys (B, n)")
        check_npz_headers(path, ("xs", "ys"))
        xs, ys = data["xs"], data["ys"]
    except ConfigError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ConfigError(f"{path}: not a readable .npz of numeric arrays ({str(err).splitlines()[0]})") from None
    if xs.dtype.kind != "f" or ys.dtype.kind != "f":
        raise ConfigError(f"{path}: xs and ys must be float arrays, got {xs.dtype} and {ys.dtype}")
    xs, ys, _ = as_prompt_tensors(xs, ys, what=str(path))
    return xs.float(), ys.float()


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..capture import RESID, capture
    from ..io.formats import load_checkpoint

    device = check_device(args.device)
    target = output_target(args, "capture", (args.checkpoint, args.prompts), kind="file")
    ckpt = load_checkpoint(args.checkpoint)
    xs, ys = load_prompts(args.prompts)
    result = capture(
        ckpt.model,
        xs,
        ys,
        hooks=[RESID, *args.hooks],
        batch_size=args.batch_size,
        device=device,
        progress=not args.quiet,
    )
    arrays = {"pred": result.pred, **{name: np.asarray(value) for name, value in result.acts.items()}}
    with writing(target) as staged, (staged / target.path.name).open("wb") as f:
        np.savez(f, **arrays)
    print(f"wrote {target.path}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in arrays.items()))
    return 0
