"""The spectral instrument's reference learners (probe/analysis/spectral.py): the filter classes it
can tell apart, the reference families with their step rules fixed, and their members' weights
on the prompts (each member a family at one grid value)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..learners import run_learner

CLASSES = {
    "gd": "GD class: 1 - (1 - eta lambda)^k (GD; Newton from alpha I is GD with 2^k steps)",
    "precond_gd": "S-preconditioned GD class: 1 - (1 - eta lambda^2)^k (the seeds' Newton is it with 2^k steps)",
    "ridge": "ridge: lambda / (lambda + c)",
    "least_squares": "least squares: r = 1",
}
CLASS_SLOPE = {"gd": 1.0, "precond_gd": 2.0, "ridge": 1.0, "least_squares": math.nan}
FINE_STEPS = tuple(sorted({round(2 ** (j / 4)) for j in range(53)}))  # 1 .. 8192, four per octave
TIE = 1e-12  # relative fit errors closer than this are equal (float round-off)
RIDGE_LAMS = tuple(float(10**e) for e in np.linspace(-2, 3, 21))


@dataclass(frozen=True)
class Family:
    """A reference family with its step rule fixed: `learner` run over `axis` (`grid` fixes the rest).
    `variable` is its own bin variable; `klass` the filter class it belongs to (`CLASSES`)."""

    name: str
    learner: str
    axis: str | None
    grid: dict[str, Any]
    variable: str
    klass: str


def reference_families(d: int, gd_eta: float | None = None, newton_alpha: float | None = None) -> list[Family]:
    """Every reference family with a per-prompt step rule and with a fixed one. The fixed steps
    default to the planted models' (probe/models/constructions): eta = (2 / (1 + sqrt d)^2) / 2 for
    GD and alpha = 1 / (2 (1 + sqrt d)^2)^2 for Newton, both on S/t."""
    eta = gd_eta if gd_eta is not None else 1.0 / (1 + math.sqrt(d)) ** 2
    alpha = newton_alpha if newton_alpha is not None else 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2
    if eta <= 0 or alpha <= 0:
        raise ConfigError(f"spectral reference steps must be > 0, got gd eta {eta} and newton alpha {alpha}")
    steps = {"steps": list(FINE_STEPS)}
    return [
        Family("gd", "gd", "steps", {**steps, "eta": ["auto"]}, "lam_max", "gd"),
        Family("gd_fixed", "gd", "steps", {**steps, "eta": [eta]}, "lam_t", "gd"),
        Family("newton_identity", "newton_identity", "iterations", {"iterations": list(range(14))}, "lam_max", "gd"),
        Family(
            "newton_identity_fixed",
            "newton_identity",
            "iterations",
            {"iterations": list(range(14)), "alpha": [eta]},
            "lam_t",
            "gd",
        ),
        Family("newton", "newton", "iterations", {"iterations": list(range(21))}, "lam_max", "precond_gd"),
        Family(
            "newton_fixed",
            "newton",
            "iterations",
            {"iterations": list(range(21)), "alpha": [alpha]},
            "lam_t",
            "precond_gd",
        ),
        Family("precond_gd", "precond_gd", "steps", {**steps, "eta": ["auto"]}, "lam_max", "precond_gd"),
        Family("precond_gd_fixed", "precond_gd", "steps", {**steps, "eta": [alpha]}, "lam_t", "precond_gd"),
        Family("ridge", "ridge", "lam", {"lam": list(RIDGE_LAMS)}, "lam_t", "ridge"),
        Family("least_squares", "least_squares", None, {}, "lam_t", "least_squares"),
    ]


@dataclass
class Members:
    """Every reference member (a family at one grid value) in order: its family and axis value,
    and its filter class as an index into `classes`."""

    family: list[Family]
    k: list[Any]
    classes: list[str]
    class_index: Tensor  # (M,) long

    def of_class(self, errors: Tensor, c: int) -> int:
        """The first best member of class c by `errors` (M,)."""
        return first_best(torch.where(self.class_index == c, errors, math.inf))

    def family_best(self, errors: Tensor) -> dict[str, int]:
        """Each family's first best member by `errors` (M,)."""
        out: dict[str, int] = {}
        for name in dict.fromkeys(f.name for f in self.family):
            idx = [i for i, f in enumerate(self.family) if f.name == name]
            out[name] = idx[first_best(errors[idx])]
        return out

    def class_min(self, errors: Tensor) -> Tensor:
        """(..., M) -> (..., C): each class's smallest error."""
        big = torch.full((*errors.shape[:-1], len(self.classes)), math.inf, dtype=errors.dtype)
        return big.scatter_reduce(-1, self.class_index.expand_as(errors), errors, "amin")


def reference_weights(families: list[Family], xs: Tensor, ys: Tensor) -> tuple[Tensor, Members]:
    """Every member's weights (M, B, n, d), and the members."""
    weights, fams, ks = [], [], []
    for fam in families:
        res = run_learner(fam.learner, xs, ys, **fam.grid)
        if res.weights is None:
            raise ConfigError(f"spectral reference '{fam.name}' has no weights")
        weights.append(res.weights)
        fams += [fam] * len(res.grid)
        ks += [g.get(fam.axis) if fam.axis else None for g in res.grid]
    classes = list(dict.fromkeys(f.klass for f in families))
    return torch.cat(weights), Members(fams, ks, classes, torch.tensor([classes.index(f.klass) for f in fams]))


def first_best(errors: Tensor) -> int:
    """The first member within TIE of the smallest error: equivalent members (GD with 2^k steps and
    Newton from alpha I) fit equally to round-off, and the family listed first names the fit."""
    return int((errors <= errors.min() + TIE).to(torch.uint8).argmax())
