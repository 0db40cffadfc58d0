"""Two models of one task, layer against layer: each layer's read-out error on the same held-out
prompts, paired, with a 90% bootstrap interval of the difference and which model is lower.

The read-outs are each model's own (fitted by its layers analysis, Fu et al. 2024, §4.1); the prompts
are the layers analysis's test prompts, drawn once for both models, so a layer's error here is the
one its read-out table reports at the same number of examples. Layers are paired by relative depth
l / L: layer l of a model with L_a blocks against layer round(l L_b / L_a) of the other (the same
index where the depths match)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..data.metrics import error_per_dim
from .pipeline import LayerSettings, ModelLens, analysis_prompts
from .readout import LayerReadouts
from .states import x_states
from .stats import bootstrap_mean


def paired_by_depth(n_a: int, n_b: int) -> list[tuple[int, int]]:
    """Layer boundaries 0..L_a of one model against 0..L_b of the other, by relative depth."""
    if n_a == n_b:
        return [(layer, layer) for layer in range(n_a + 1)]
    return [(layer, int(np.floor(layer * n_b / n_a + 0.5))) for layer in range(n_a + 1)]


def layer_errors(model, readouts: LayerReadouts | None, xs, ys, n_dims: int, settings: LayerSettings) -> torch.Tensor:
    """Per prompt and layer, a read-out's squared error / d at every position: (B, L+1, n)."""
    states, _ = x_states(model, xs, ys, settings.device, settings.batch_size, memory=settings.memory)
    lens = ModelLens(model) if readouts is None else readouts
    preds = torch.as_tensor(lens.predict(states), dtype=torch.float64)  # (L+1, B, n)
    return error_per_dim(preds, ys.double().unsqueeze(0), n_dims).permute(1, 0, 2)


def paired_layer_difference(
    model_a,
    readouts_a: LayerReadouts | None,
    model_b,
    readouts_b: LayerReadouts | None,
    task,
    settings: LayerSettings,
    n_examples: int,
    n_boot: int = 1000,
) -> pd.DataFrame:
    """Per pair of layers (relative depth): error / d of each model's read-out at `n_examples`
    examples on the same `settings.prompts.test` prompts, the mean paired difference a - b with its
    90% bootstrap interval, and which is lower ("a", "b", or None where the interval reaches 0).

    readouts None: the model's own lens at every layer (read-out method "model")."""
    prompts = analysis_prompts(task, settings, "test", settings.prompts.test)
    if not 0 <= n_examples < prompts.xs.shape[1]:
        raise ValueError(f"n_examples {n_examples} is outside 0..{prompts.xs.shape[1] - 1} for these prompts")
    err_a = layer_errors(model_a, readouts_a, prompts.xs, prompts.ys, task.n_dims, settings)[..., n_examples]
    err_b = layer_errors(model_b, readouts_b, prompts.xs, prompts.ys, task.n_dims, settings)[..., n_examples]
    pairs = paired_by_depth(err_a.shape[1] - 1, err_b.shape[1] - 1)
    diff = torch.stack([err_a[:, la] - err_b[:, lb] for la, lb in pairs], dim=1)  # (B, pairs)
    lo, hi = bootstrap_mean(diff, n_boot=n_boot, seed=settings.prompts.seed)
    top = max(err_a.shape[1] - 1, 1)
    frame = pd.DataFrame(
        {
            "layer_a": [la for la, _ in pairs],
            "layer_b": [lb for _, lb in pairs],
            "relative_depth": [round(la / top, 3) for la, _ in pairs],
            "n_examples": n_examples,
            "error_a": [float(err_a[:, la].mean()) for la, _ in pairs],
            "error_b": [float(err_b[:, lb].mean()) for _, lb in pairs],
            "difference": diff.mean(0).numpy(),
            "ci_low": lo.numpy(),
            "ci_high": hi.numpy(),
        }
    )
    frame["lower"] = [("a" if h < 0 else "b" if lw > 0 else None) for lw, h in zip(frame.ci_low, frame.ci_high)]
    return frame
