"""Building and saving planted models as ordinary icl-probe checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

from ..core.config import ModelConfig, RunConfig, TaskConfig
from ..core.errors import ConfigError
from ..core.provenance import stamp
from ..models.planted import ADAM_LAYERS_PER_STEP, gd_stable_limit, newton_default_alpha
from ..models.plants import plant
from ..models.xorshift import PRNG_BITS
from .checkpoint import save_model

SGD_BOUND = 1000.0  # R of the SGD construction: its gradient is exact while every |residual| <= R
PRNG_OUTPUTS = 4  # M, the numbers one prng block emits (o_1..o_M)
ADAM_STEP = 0.1  # default eta of the Adam construction


def _stochastic_config(
    algorithm: str, layers: int, d: int, step_size: float | None, eps: float, batch: int, seed: int, outputs: int
) -> dict:
    """ModelConfig fields of the seed 000 constructions (probe/models/planted.py), checked."""
    if algorithm in ("sgd", "adam"):
        if algorithm == "adam":
            scale = ADAM_STEP if step_size is None else step_size
            if not 0 < scale <= 1:
                raise ConfigError(
                    f"--step-size must lie in (0, 1] for Adam (each step moves w by about eta), got {scale}"
                )
            if layers % ADAM_LAYERS_PER_STEP:
                raise ConfigError(
                    f"a planted adam model has {ADAM_LAYERS_PER_STEP} layers per step; use --layers 4, 8, 12, ..."
                )
        else:
            limit = gd_stable_limit(d)
            scale = limit / 2 if step_size is None else step_size
            if not 0 < scale < limit:
                raise ConfigError(
                    f"--step-size {scale} is unstable for d={d}: SGD needs 0 < eta < {limit:.4f}; try {limit / 2:.4f}"
                )
        if batch < 1:
            raise ConfigError(f"--batch must be an integer >= 1, got {batch}")
        return {"planted_scale": float(scale), "planted_batch": batch, "planted_seed": seed, "planted_bound": SGD_BOUND}
    if layers != 1:
        raise ConfigError(
            f"a planted {algorithm} model is one block (seed 000 Thm. {2 if algorithm == 'uniform' else 3}); use --layers 1"
        )
    if algorithm == "uniform":
        if not math.isfinite(eps) or eps <= 0:
            raise ConfigError(f"--eps must be a number > 0 (the ramp half-width of the empirical CDF), got {eps}")
        return {"planted_scale": float(eps)}
    if d != PRNG_BITS:
        raise ConfigError(
            f"a planted prng model reads its xorshift32 seed from x_1's {PRNG_BITS} bits; use --dims {PRNG_BITS}"
        )
    if outputs < 1:
        raise ConfigError(f"--outputs must be an integer >= 1, got {outputs}")
    return {"n_head": outputs}


def planted_config(
    algorithm: str,
    layers: int,
    d: int,
    points: int,
    step_size: float | None = None,
    alpha: float | None = None,
    eps: float = 0.05,
    batch: int = 4,
    seed: int = 0,
    outputs: int = PRNG_OUTPUTS,
) -> RunConfig:
    for name, value in (("--step-size", step_size), ("--alpha", alpha)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
    if algorithm in ("sgd", "adam", "uniform", "prng"):
        fields = {"n_head": 1, **_stochastic_config(algorithm, layers, d, step_size, eps, batch, seed, outputs)}
        model = ModelConfig(
            family="planted", n_dims=d, n_positions=points, n_embd=1, n_layer=layers, planted=algorithm, **fields
        )
        return RunConfig(model=model, task=TaskConfig(n_dims=d, n_points=points))
    if algorithm == "gd":
        limit = gd_stable_limit(d)
        scale = limit / 2 if step_size is None else step_size
        if not 0 < scale < limit:
            raise ConfigError(
                f"--step-size {scale} is unstable for d={d}: GD on ||y - Xw||^2/(2t) needs "
                f"0 < eta < 2/(1+sqrt d)^2 = {limit:.4f} on short prefixes; try {limit / 2:.4f}"
            )
    else:
        if algorithm == "newton" and layers < 3:
            raise ConfigError("a planted Newton model needs at least 3 layers (initialisation, then 2 per iteration)")
        if algorithm == "newton-relu" and layers < 2:
            raise ConfigError(
                "a planted ReLU-attention Newton model needs at least 2 layers (initialisation, then 1 per iteration)"
            )
        scale = newton_default_alpha(d) if alpha is None else alpha
        limit = 2.0 / (1 + d**0.5) ** 4
        if not 0 < scale < limit:
            raise ConfigError(
                f"--alpha {scale} is unstable for d={d}: Newton needs 0 < alpha < 2/lambda_max(S/t)^2, "
                f"here about {limit:.5f}; try {newton_default_alpha(d):.5f}"
            )
    model = ModelConfig(
        family="planted",
        n_dims=d,
        n_positions=points,
        n_embd=1,
        n_layer=layers,
        n_head=1,
        planted=algorithm,
        planted_scale=float(scale),
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
