"""Reference learning algorithms, batched over prompts, prefixes and hyper-parameter grids.

result = run_learner("newton", xs, ys, iterations=range(25))
result.preds  # (K, B, n)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch import Tensor

from ..core import budget
from ..core.errors import ConfigError
from ..core.validate import as_prompt_tensors
from . import closed_form, iterative, krylov, network, nonparametric, online, stochastic  # noqa: F401  (registration
from .base import LearnerResult, check_prompts, prefix_moments
from .registry import LEARNERS, LearnerSpec

TENSOR_ARGUMENTS = ("masks",)  # arguments that are arrays, not grids of values


def run_learner(
    name: str, xs: Tensor, ys: Tensor, queries: Tensor | None = None, *, last_prefix: bool = False, **grid: Any
) -> LearnerResult:
    """Run learner `name` on prompts xs (B, n, d), ys (B, n) over its hyper-parameter grid.

    Prompts may be tensors or numpy arrays; they must be finite. Grid values are checked
    (integral step counts, positive penalties and step sizes, non-empty grids) and the work they
    ask for (probe/core/budget.py) before any work. `last_prefix`: the result at the last prefix
    alone (`LearnerResult.last_prefix`), which the closed-form and spectral learners compute
    without the others (the same numbers).
    """
    spec = LEARNERS.get(name)
    xs, ys, queries = as_prompt_tensors(xs, ys, queries, what=f"learner '{name}'")
    check_prompts(xs, ys, queries)
    unknown = set(grid) - set(spec.defaults)
    if unknown:
        raise ConfigError(
            f"learner '{name}' has no hyper-parameter {sorted(unknown)}; it takes {sorted(spec.defaults) or 'none'}"
        )
    tensors = {k: grid.pop(k) for k in TENSOR_ARGUMENTS if k in grid}  # checked by the learner itself
    grid = spec.check(grid)
    b, n, d = xs.shape
    sweep = SimpleNamespace(label=name, learner=name, grid={**spec.defaults, **grid})
    budget.check(budget.learner_estimates([sweep], b, n, d, where="learner"))
    # a ValueError from inside is a bug, not the user's
    if last_prefix and spec.last_prefix:
        return spec.fn(xs, ys, queries, last_prefix=True, **grid, **tensors)
    result = spec.fn(xs, ys, queries, **grid, **tensors)
    return result.last_prefix() if last_prefix else result


__all__ = ["LEARNERS", "LearnerResult", "LearnerSpec", "prefix_moments", "run_learner"]


def check_sweep(s, what: str) -> None:
    """A learner sweep (SweepSettings: a [[sweeps]] entry or a section's learner) names a learner,
    hyper-parameters and an axis that exist; its grid is validated in place."""
    spec = LEARNERS.get(s.learner)  # unknown learner -> close-match suggestion
    unknown = set(s.grid) - set(spec.defaults)
    if unknown:
        raise ConfigError(
            f"{what} '{s.label}': learner '{s.learner}' has no hyper-parameter {sorted(unknown)}; "
            f"it takes {sorted(spec.defaults)}"
        )
    if s.axis is not None and s.axis not in spec.defaults:
        raise ConfigError(f"{what} '{s.label}': axis '{s.axis}' is not a hyper-parameter of '{s.learner}'")
    s.grid = spec.check(s.grid, where=f"{what} '{s.label}'")
