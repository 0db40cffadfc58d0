"""The learner registry: name -> batched function, with its hyper-parameter grid defaults."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.registry import Registry
from ..core.validate import GRID_RULES, Rule, check_grid


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
    rules: Mapping[str, Rule] = field(default_factory=dict)  # hyper-parameter -> what its values may be

    def check(self, grid: dict[str, Any], where: str = "") -> dict[str, Any]:
        """`grid` checked against this learner's rules (probe/core/validate.py `Rule`), normalised."""
        return check_grid(self.name, grid, where, self.rules)

    @property
    def title(self) -> str:
        return self.label or self.name.replace("_", " ")


LEARNERS: Registry[LearnerSpec] = Registry("learner")


def signature_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only hyper-parameters of a learner and their defaults: the one place they are written."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def register(
    name: str,
    label: str = "",
    unit: str = "iterations",
    describe: Callable[[dict[str, Any]], str] | None = None,
    rules: Mapping[str, Rule] | None = None,
):
    """Register a learner `fn(xs, ys, queries=None, [last_prefix=False,] *, <grid>)`; its grid defaults
    come from its signature; `label`, `unit` and `describe` are how reports name it and say what a
    grid ran. A learner that takes `last_prefix` computes only the last prefix when it is true.

    Its hyper-parameters' values are checked against `rules` where given, else GRID_RULES
    (probe/core/validate.py): the same rules for a recipe's grid, `run_learner` and a direct call of
    the returned function, which checks its keyword arguments before it runs."""

    def decorator(fn):
        defaults = signature_defaults(fn)
        own = {key: (rules or {}).get(key, GRID_RULES.get(key, Rule())) for key in defaults}
        checked = {key for key, rule in own.items() if rule.kind != "any"}  # tensors (masks) pass as they are
        where = f"learner '{name}'"

        @functools.wraps(fn)
        def run(*args, **kwargs):
            grid = {key: kwargs[key] for key in checked & kwargs.keys()}
            return fn(*args, **{**kwargs, **check_grid(name, grid, where, own)})

        last_prefix = "last_prefix" in inspect.signature(fn).parameters
        LEARNERS.register(name)(LearnerSpec(name, run, defaults, label, unit, describe, last_prefix, own))
        return run

    return decorator
