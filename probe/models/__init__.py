"""In-context regression models: Garg et al.'s GPT-2 and the LSTM baseline."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .base import ModelOutput
from .gpt2 import GPT2ICL
from .lstm import LSTMICL
from .planted import PlantedICL

FAMILIES = {"gpt2": GPT2ICL, "lstm": LSTMICL, "planted": PlantedICL}


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised model for `cfg` (seed torch beforehand for reproducibility)."""
    family: type[nn.Module] = FAMILIES[cfg.family]  # type: ignore[assignment]
    return family(cfg)


__all__ = ["FAMILIES", "GPT2ICL", "LSTMICL", "ModelOutput", "build_model"]
