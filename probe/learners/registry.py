"""The learner registry: name -> batched function, with its hyper-parameter grid defaults."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.registry import Registry


@dataclass(frozen=True)
class LearnerSpec:
    """A learner as the rest of the package sees it: its function, grid defaults, and how it
    describes itself (the report's words come from here, not from the presentation code)."""

    name: str
    fn: Callable[..., Any]
    defaults: dict[str, Any]  # hyper-parameter name -> default grid
    label: str = ""  # in words: "Iterative Newton"
    unit: str = "iterations"  # what its step count counts: "steps" or "iterations"
    describe: Callable[[dict[str, Any]], str] | None = None  # a grid -> what was run, in words
    last_prefix: bool = False  # fn computes the last prefix alone when asked (`last_prefix=True`)

    @property
    def title(self) -> str:
        return self.label or self.name.replace("_", " ")


LEARNERS: Registry[LearnerSpec] = Registry("learner")


def signature_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only hyper-parameters of a learner and their defaults: the one place they are written."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def register(
    name: str, label: str = "", unit: str = "iterations", describe: Callable[[dict[str, Any]], str] | None = None
):
    """Register a learner `fn(xs, ys, queries=None, [last_prefix=False,] *, <grid>)`; its grid defaults
    come from its signature; `label`, `unit` and `describe` are how reports name it and say what a
    grid ran. A learner that takes `last_prefix` computes only the last prefix when it is true."""

    def decorator(fn):
        last_prefix = "last_prefix" in inspect.signature(fn).parameters
        LEARNERS.register(name)(LearnerSpec(name, fn, signature_defaults(fn), label, unit, describe, last_prefix))
        return fn

    return decorator
