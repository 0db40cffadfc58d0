"""Which spectral filter each layer applies (probe/analysis/spectral.py): each layer's induced
weights against the least-squares weights along every eigen-direction of the prompt's own S, the
local exponent p (1: the GD class, 2: Fu et al.'s Newton class) and the best-fitting filter class with
a paired interval over prompts. The report's spectral section, on its own (no learner sweeps).

examples:
  icl-probe spectral checkpoints/gpt2-default --out reports/spectral
  icl-probe spectral checkpoints/planted/newton --out /tmp/spectral --bins 16 --induced-prompts 128
"""

from __future__ import annotations

import argparse

from .common import output_target, writing
from .layers import add_layer_args, settings_from_args, write_tables


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..analysis.spectral import SpectralSettings
    from ..core.settings import add_flags

    add_layer_args(p)
    add_flags(p, "spectral", SpectralSettings, ["bins", "min_count", "r_low", "r_high"])


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..analysis.pipeline import analyse_spectrum
    from ..analysis.spectral import spectral_tables
    from ..core.provenance import display_path
    from ..io.formats import load_checkpoint
    from ..reporting import figures

    target = output_target(args, "spectral", (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    settings = settings_from_args(args, ckpt)
    result = analyse_spectrum(ckpt.model, ckpt.config.task, settings, progress=not args.quiet)
    with writing(target) as out:
        meta = {
            "command": "spectral",
            "checkpoint": display_path(ckpt.path),
            "settings": {**asdict(settings.spectral), "prompts": asdict(settings.prompts)},
            "counts": result.counts,
        }
        write_tables(out, spectral_tables(result), meta)
        for variable in result.curves.variable.unique():
            figures.spectral_curves(result.curves, variable, out / f"spectral_{variable}")
        figures.spectral_exponents(result.layers, out / "spectral_exponents")
    view = result.summary[["predictor", "verdict", "p", "p_low", "p_high", "variable", "best_family", "best_k"]]
    print(view.rename(columns={"predictor": "layer"}).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {target.path}")
    return 0
