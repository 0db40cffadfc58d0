"""The spectral instrument's reference learners (probe/analysis/spectral.py): the filter classes it
can tell apart, the reference families with their step rules fixed, and their members' weights
on the prompts (each member a family at one grid value)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..learners import run_learner
from ..learners.iterative import prefix_eigh

log = logging.getLogger(__name__)

CLASSES = {
    "gd": "GD class: 1 - (1 - eta lambda)^k (GD; Newton from alpha I is GD with 2^k steps)",
    "precond_gd": "S-preconditioned GD class: 1 - (1 - eta lambda^2)^k (Fu et al.'s Newton is it with 2^k steps)",
    "ridge": "ridge class: lambda / (lambda + c), penalty c fixed or proportional to t",
    "pcr": "principal-component regression: r = 1 on S's top m eigen-directions, 0 below (no exponent)",
    "least_squares": "least squares: r = 1",
}
CLASS_SLOPE = {"gd": 1.0, "precond_gd": 2.0, "ridge": 1.0, "pcr": math.nan, "least_squares": math.nan}
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


def reference_families(
    d: int, gd_eta: float | None = None, newton_alpha: float | None = None, xs: Tensor | None = None
) -> list[Family]:
    """Every reference family with a per-prompt step rule and with a fixed one. The fixed steps
    default to the planted models' (probe/models/constructions): eta = (2 / (1 + sqrt d)^2) / 2 for
    GD and alpha = 1 / (2 (1 + sqrt d)^2)^2 for Newton, both on S/t. Given the prompts `xs`, a step
    that diverges on them is sized to their spectrum instead (`stable_steps`)."""
    eta = gd_eta if gd_eta is not None else 1.0 / (1 + math.sqrt(d)) ** 2
    alpha = newton_alpha if newton_alpha is not None else 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2
    if not (eta > 0 and alpha > 0):
        raise ConfigError(f"spectral reference steps must be > 0, got gd eta {eta} and newton alpha {alpha}")
    if xs is not None:
        eta, alpha = stable_steps(xs, eta, alpha)
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
        # (S + c I)^-1 X^T y: a filter lambda / (lambda + c) of S's own eigenvalue, neither variable's
        Family("ridge", "ridge", "lam", {"lam": list(RIDGE_LAMS)}, "lam", "ridge"),
        # (S + c t I)^-1 X^T y: lambda/t / (lambda/t + c), a fixed filter of lambda / t
        Family(
            "ridge_per_example", "ridge", "lam", {"lam": list(RIDGE_LAMS), "penalty": ["per_example"]}, "lam_t", "ridge"
        ),
        # least squares on S's top m eigen-directions: a step in rank, not a filter of either variable
        # (classed by fit error alone); m = d is least squares
        Family("pcr", "pcr", "components", {"components": list(range(1, d))}, "lam_max", "pcr"),
        Family("least_squares", "least_squares", None, {}, "lam_t", "least_squares"),
    ]


def stable_steps(xs: Tensor, eta: float, alpha: float) -> tuple[float, float]:
    """The fixed steps on S/t, kept where they converge on every prompt and prefix t >= d of `xs`
    (eta lambda_max < 2 for GD and Newton from alpha I, alpha lambda_max^2 < 2 for Fu et al.'s Newton
    and S-preconditioned GD, lambda_max the largest eigenvalue of S_t / t), else sized to that
    spectrum: eta = 1 / lambda_max, alpha = 1 / lambda_max^2. Steps sized for isotropic inputs
    diverge at kappa = 100, and a diverging member fits nothing."""
    xs = torch.as_tensor(xs, dtype=torch.float64)
    d = xs.shape[-1]
    if xs.shape[1] <= d:
        return eta, alpha
    lam, _, _, t = prefix_eigh(xs, torch.zeros(xs.shape[:2], dtype=xs.dtype))
    top = float((lam[:, d:] / t[d:].clamp_min(1).view(1, -1, 1)).amax())
    if not top > 0:
        return eta, alpha
    return (eta if eta * top < 2 else 1.0 / top), (alpha if alpha * top**2 < 2 else 1.0 / top**2)


@dataclass
class Members:
    """Every reference member (a family at one grid value) in order: its family and axis value,
    and its filter class as an index into `classes`."""

    family: list[Family]
    k: list[Any]
    classes: list[str]
    class_index: Tensor  # (M,) long
    dropped: dict[str, int] = field(default_factory=dict)  # family -> members dropped as non-finite

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
        """(..., M) -> (..., C): each class's smallest finite error (inf where it has none)."""
        finite = torch.where(torch.isfinite(errors), errors, math.inf)
        big = torch.full((*errors.shape[:-1], len(self.classes)), math.inf, dtype=errors.dtype)
        return big.scatter_reduce(-1, self.class_index.expand_as(errors), finite, "amin")


def reference_weights(families: list[Family], xs: Tensor, ys: Tensor) -> tuple[Tensor, Members]:
    """Every member's weights (M, B, n, d), and the members. A member whose weights are not finite
    on some prompt at a prefix t >= d (a fixed step that diverges there) is dropped and counted in
    `Members.dropped`, with a warning when a family loses most of its members."""
    weights, fams, ks, dropped = [], [], [], {}
    d = xs.shape[-1]
    for fam in families:
        res = run_learner(fam.learner, xs, ys, **fam.grid)
        if res.weights is None:
            raise ConfigError(f"spectral reference '{fam.name}' has no weights")
        finite = torch.isfinite(res.weights[:, :, d:]).flatten(1).all(1)
        dropped[fam.name] = int((~finite).sum())
        if dropped[fam.name] * 2 > len(res.grid):
            log.warning(
                "spectral reference %s: %d of %d members diverge on these prompts and are left out",
                fam.name,
                dropped[fam.name],
                len(res.grid),
            )
        keep = finite.nonzero().flatten().tolist()
        weights.append(res.weights[keep])
        fams += [fam] * len(keep)
        ks += [res.grid[i].get(fam.axis) if fam.axis else None for i in keep]
    classes = list(dict.fromkeys(f.klass for f in fams))
    index = torch.tensor([classes.index(f.klass) for f in fams])
    return torch.cat(weights), Members(fams, ks, classes, index, dropped)


def first_best(errors: Tensor) -> int:
    """The first member within TIE of the smallest finite error: equivalent members (GD with 2^k
    steps and Newton from alpha I) fit equally to round-off, and the family listed first names the
    fit. A non-finite error never wins (index 0 only when none is finite)."""
    finite = torch.where(torch.isfinite(errors), errors, math.inf)
    return int((finite <= finite.min() + TIE).to(torch.uint8).argmax())
