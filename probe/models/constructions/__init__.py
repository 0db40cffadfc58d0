"""Planted constructions: one class per construction (its module documents the equations it
implements), registered by name in `CONSTRUCTIONS`. Adding one is a module here plus its line
below; `PlantedICL` (probe/models/planted.py) runs them all."""

from . import adam, gd, newton, newton_relu, prng, sgd, uniform  # noqa: F401  (registration)
from .base import CONSTRUCTIONS, Construction, Layout, PlantOptions, select

__all__ = ["CONSTRUCTIONS", "Construction", "Layout", "PlantOptions", "select"]
