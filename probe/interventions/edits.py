"""Edits of an activation, as TransformerLens hook functions (value, hook) -> value: the one
definition each path applies, whether it runs the model with hooks (probe/interventions/runner.py)
or resumes the forward from the edited boundary (probe/interventions/resumed.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..core.errors import ConfigError

Hook = tuple[str, Callable]


def patch_hook(name: str, mask: Tensor, source: Tensor) -> Hook:
    """Where `mask` is true, the activation is taken from `source` (same native layout)."""

    def edit(value: Tensor, hook) -> Tensor:
        if source.shape != value.shape:
            raise ConfigError(
                f"patch source {tuple(source.shape)} does not match the activation {tuple(value.shape)} at {name}"
            )
        return torch.where(mask, source, value)

    return name, edit
