"""In-context regression models: Garg et al.'s GPT-2, the LSTM baseline and linear self-attention."""

from __future__ import annotations

import torch
from torch import nn

from ..core.seeds import Stream, stream_seed
from .base import FamilyTraits, ModelOutput
from .config import FAMILIES, ModelConfig
from .gpt2 import GPT2ICL
from .lsa import LinearSelfAttentionICL, MLPLinearSelfAttentionICL, SparseLinearSelfAttentionICL
from .lstm import LSTMICL, ResidualLSTMICL
from .planted import PlantedICL


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised model for `cfg` (seed torch beforehand for reproducibility)."""
    family: type[nn.Module] = FAMILIES.get(cfg.family)
    return family(cfg)


__all__ = [
    "FAMILIES",
    "GPT2ICL",
    "LSTMICL",
    "LinearSelfAttentionICL",
    "MLPLinearSelfAttentionICL",
    "ModelOutput",
    "PlantedICL",
    "ResidualLSTMICL",
    "SparseLinearSelfAttentionICL",
    "build_model",
    "family_class",
    "has_random_init",
    "random_weights_model",
]


def family_class(family: str) -> type[FamilyTraits]:
    """The class of a model family (FAMILIES), which declares its traits (probe/models/base.py
    `FamilyTraits`): the one place code outside a family's module asks about it."""
    return FAMILIES.get(family)


def has_random_init(family: str) -> bool:
    """Whether a family's fresh instance is a random-weights control (its class's `random_init`)."""
    return bool(family_class(family).random_init)


def random_weights_model(model_config, seed: int) -> nn.Module | None:
    """The random-weights control: the architecture of `model_config`, initialised from the seed's random-
    weights stream (the same model for the probes' control and the null baselines; probe/core/seeds.py). None
    for a planted construction: its weights are the construction, and its class has no
    initialisation (a fresh one is all zeros), so there is no random-weights control to draw."""

    if not has_random_init(model_config.family):
        return None
    with torch.random.fork_rng(devices=[]):  # the caller's global random state is left as it was
        torch.manual_seed(stream_seed(seed, Stream.RANDOM_WEIGHTS))
        return build_model(model_config).eval()
