"""The learner registry: name -> batched function, with its hyper-parameter grid defaults."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..registry import Registry


@dataclass(frozen=True)
class LearnerSpec:
    name: str
    fn: Callable[..., Any]
    defaults: dict[str, Any]  # hyper-parameter name -> default grid


LEARNERS: Registry[LearnerSpec] = Registry("learner")


def signature_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only hyper-parameters of a learner and their defaults: the one place they are written."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def register(name: str):
    """Register a learner `fn(xs, ys, queries=None, *, <grid>)`; its grid defaults come from its signature."""

    def decorator(fn):
        LEARNERS.register(name)(LearnerSpec(name, fn, signature_defaults(fn)))
        return fn

    return decorator
