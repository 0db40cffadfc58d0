"""A model's sizes from its config or its protocol, for the affordability estimates (probe/core/budget.py)
and the checkpoints' size checks: what needs to know the model families lives here, not in budget."""

from __future__ import annotations

import math

from ..core.budget import Shape
from ..core.memory import nbytes


def model_bytes(model_cfg) -> int:
    """float32 bytes of a model's parameters, from its config alone (before building it): its family
    class's `parameter_count`."""
    from .config import FAMILIES

    return 4 * FAMILIES.get(model_cfg.family).parameter_count(model_cfg)


def activation_bytes(model_cfg, batch: int, points: int, *, training: bool = False) -> int:
    """A rough upper estimate of a forward (and backward) pass's activations in float32."""
    m = model_cfg
    tokens = 2 * points
    width = max(m.n_embd, 2 * m.n_dims + 2)
    per_layer = tokens * width * 16 + max(m.n_head, 1) * tokens * tokens * 2
    total = batch * m.n_layer * per_layer * 4
    return total * (3 if training else 1)


def shape_of(model_or_config) -> Shape:
    """The Shape of a model (any object with the model protocol) or of a ModelConfig."""
    cfg = getattr(model_or_config, "config", model_or_config)
    from .config import FAMILIES, ModelConfig

    if isinstance(cfg, ModelConfig):
        return FAMILIES.get(cfg.family).shape(cfg)  # the family's own sizes (planted: its construction's)
    if hasattr(cfg, "n_layer") and hasattr(cfg, "n_embd"):
        return Shape(max(cfg.n_layer, 1), max(cfg.n_embd, 1), cfg.n_dims)
    m = model_or_config
    if all(hasattr(m, name) for name in ("n_layers", "d_model", "n_dims")):
        return Shape(max(int(m.n_layers), 1), max(int(m.d_model), 1), int(m.n_dims))
    params = sum(p.numel() for p in m.parameters()) if hasattr(m, "parameters") else 0
    return Shape(1, max(int(math.sqrt(params / 12)), 1), 1)  # a bare forward: one block of its parameter count


FORWARD_BATCH_BYTES = 512 << 20  # the most one batch's forward pass may take by that estimate, whatever the budget


def forward_batch(model, n: int, batch_size: int, headroom: int | None = None) -> int:
    """The batch size, lowered so that one batch's forward pass (every boundary, the MLP's 4x hidden
    width and the attention scores: about 8 (L+2) 2n D floats a prompt) takes at most
    FORWARD_BATCH_BYTES and what `headroom` leaves. Larger batches gain nothing on a CPU (a batch of
    such a size already fills the matrix products) but their temporaries raise the peak memory; the
    forward is batch-invariant, so no number depends on the batch."""
    per_prompt = nbytes((8, model.n_layers + 2, 2 * n, model.d_model))
    limit = FORWARD_BATCH_BYTES if headroom is None else min(FORWARD_BATCH_BYTES, headroom)
    return max(1, min(batch_size, limit // per_prompt))
