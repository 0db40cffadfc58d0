"""Null baselines for the similarities: can a match be told apart from predicting 0?

A layer whose predictions are ~0 has error vector E = y, and so does "GD after 0 steps" (and
any learner far from converged): SimE (Fu et al. 2024, eq. 10) between them is ~1 although neither has
learned anything. Every layer is therefore also compared with two null predictors on the same
prompts: the zero predictor and a random-weights model of the same architecture (its own
predictions). A best match is *degenerate* ("not distinguishable from predicting 0") when

    SimE(layer, zero) >= ci_low(best match),

i.e. the zero predictor scores within the match's bootstrap interval or above it, or when the
layer itself predicts ~0 (||f_layer|| < ZERO_FRACTION ||y|| over prompts and positions t >= 1),
which also makes its SimW meaningless (induced weights of a ~0 predictor are noise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..data.tasks import Prompts
from ..models import random_weights_model
from .evaluate import predict
from .similarity import sime
from .stats import bootstrap_mean

ZERO_FRACTION = 0.1


def null_predictions(
    model, xs: torch.Tensor, ys: torch.Tensor, seed: int, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Predictions (B, n) of the zero predictor and of a seeded random-weights copy of the architecture."""
    nulls = {"zero": torch.zeros_like(ys, dtype=torch.float64)}
    config = getattr(model, "config", None)
    random_model = random_weights_model(config, seed) if config is not None else None  # the probes' control
    if random_model is not None:
        nulls["random_model"] = predict(random_model, Prompts(xs, ys), device=device).double()
    return nulls


def null_table(
    layer_preds: np.ndarray,
    ys: torch.Tensor,
    nulls: dict[str, torch.Tensor],
    include_first: bool,
    n_boot: int,
    seed: int,
) -> pd.DataFrame:
    """Per layer and null: SimE with its bootstrap interval, and whether the layer predicts ~0."""
    lp = torch.as_tensor(layer_preds, dtype=torch.float64)
    y = ys.double().cpu()
    start = 0 if include_first else 1
    rel = (lp[:, :, start:].norm(dim=(1, 2)) / y[:, start:].norm().clamp_min(1e-12)).numpy()
    rows = []
    for name, pred in nulls.items():
        values = sime(lp, pred.unsqueeze(0).cpu(), y, include_first)[:, 0]  # (L+1, B)
        lo, hi = bootstrap_mean(values.T, n_boot=n_boot, seed=seed)
        for layer in range(lp.shape[0]):
            rows.append(
                {
                    "layer": layer,
                    "null": name,
                    "similarity": float(values[layer].mean()),
                    "ci_low": float(lo[layer]),
                    "ci_high": float(hi[layer]),
                    "relative_norm": float(rel[layer]),
                    "predicts_zero": bool(rel[layer] < ZERO_FRACTION),
                }
            )
    return pd.DataFrame(rows)


def flag_degenerate(best: pd.DataFrame, nulls: pd.DataFrame) -> pd.DataFrame:
    """`best` with zero_similarity, random_similarity, predicts_zero and degenerate per row."""
    by = nulls.pivot_table(index="layer", columns="null", values="similarity")
    zero = best.layer.map(by["zero"]) if "zero" in by else np.nan
    rand = best.layer.map(by["random_model"]) if "random_model" in by else np.nan
    predicts_zero = best.layer.map(nulls.drop_duplicates("layer").set_index("layer").predicts_zero).astype(bool)
    degenerate = predicts_zero | ((best.metric == "sime") & (best.ci_low <= zero))
    return best.assign(
        zero_similarity=zero, random_similarity=rand, predicts_zero=predicts_zero, degenerate=degenerate.astype(bool)
    )
