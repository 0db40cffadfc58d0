"""Building and saving planted models as ordinary icl-probe checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

from ..core.errors import ConfigError
from ..core.provenance import stamp
from ..data.config import TaskConfig
from ..models.config import ModelConfig
from ..models.constructions import CONSTRUCTIONS, PlantOptions
from ..models.planted import plant
from .checkpoint import save_model
from .run_config import RunConfig


def planted_config(
    algorithm: str,
    layers: int,
    d: int,
    points: int,
    step_size: float | None = None,
    alpha: float | None = None,
    **options,
) -> RunConfig:
    """The run config of a planted model: the construction's fields (its defaults filled and checked,
    probe/models/constructions/) on a linear-regression task of d dimensions and `points` points.
    `options`: eps (uniform), batch and seed (sgd, adam), outputs (prng)."""
    for name, value in (("--step-size", step_size), ("--alpha", alpha)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
    construction = CONSTRUCTIONS.get(algorithm)
    fields = construction.model_fields(layers, d, PlantOptions(step_size=step_size, alpha=alpha, **options))
    model = ModelConfig(
        family="planted", n_dims=d, n_positions=points, n_embd=1, n_layer=layers, planted=algorithm, **fields
    )
    return RunConfig(model=model, task=TaskConfig(n_dims=d, n_points=points))


def write_planted(
    algorithm: str,
    layers: int,
    d: int,
    points: int,
    out: str | Path,
    step_size: float | None = None,
    alpha: float | None = None,
    **options,
) -> Path:
    """Build and save a planted model; `options`: eps (uniform), batch and seed (sgd), outputs (prng)."""
    cfg = planted_config(algorithm, layers, d, points, step_size, alpha, **options)
    model = plant(cfg.model)
    out = Path(out)
    save_model(model, cfg, out, {**stamp(), "planted": {"algorithm": algorithm, "scale": cfg.model.planted_scale}})
    return out
