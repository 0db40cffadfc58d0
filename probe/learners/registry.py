"""The learner registry: name -> batched function, with its hyper-parameter grid defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..registry import Registry


@dataclass(frozen=True)
class LearnerSpec:
    name: str
    fn: Callable[..., Any]
    defaults: dict[str, Any]  # hyper-parameter name -> default grid

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]


LEARNERS: Registry[LearnerSpec] = Registry("learner")


def register(name: str, defaults: dict[str, Any]):
    def decorator(fn):
        LEARNERS.register(name)(LearnerSpec(name, fn, defaults))
        return fn

    return decorator
