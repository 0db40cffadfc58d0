"""Out-of-distribution prompt families of Garg et al.'s evaluation (dtsip/in-context-learning,
src/eval.py `build_evals` and its `gen_*` prompting strategies), as shifts of a linear task.

A shifted prompt holds its examples xs (B, n, d) and, per position t, the query asked after the
first t examples, `queries` (B, n, d), with its label `query_ys`: by causality the prediction at
position t of the prompt (x_1, y_1, ..., x_t, y_t, q_t) depends on nothing after q_t, so each
position is one test, as eval.py's `eval_batch` runs it. Standard prompts ask q_t = x_{t+1}.

Each shift names the eval.py entry it follows; where eval.py's definition differs from its name,
the definition is followed:

- `random_quadrants`: examples |x| * s with one random sign pattern s per prompt (one orthant),
  the query *not* shifted (an ordinary draw).
- `opposite_quadrants`: examples as random_quadrants, the query the negated example draw (the
  opposite orthant); defined in eval.py but not in its default list.
- `orthogonal_train_test`: the query is x_{t+1} with its projection on span(x_1..x_t) removed,
  rescaled to x_{t+1}'s norm; defined for t < d only (positions t >= d are left out, NaN). Every
  learner that stays in the span of the examples predicts exactly 0 there.
- `overlapping_train_test`: the query is one of the t examples, drawn uniformly (t >= 1).
- `half_subspace`: x = z T with T = U diag(e) U^T, e = 1 on d/2 directions and 0 on the rest,
  normalised so that sum(e^2) = d; one random U per evaluation; the query lies in the subspace too.
- `skewed`: as half_subspace with e_i = 1/(i+1) (T's eigenvalues; the covariance's are e_i^2).
- `scale_x` (value s): x = s z (eval.py's scale-x=s: T has every eigenvalue s).
- `scale_y` (value s): y = s x.w (eval.py's scale-y=s, the task's weight scale).
- `noisy` (value sigma, default 1): y + sigma * noise, then every label of the batch rescaled so
  that its standard deviation is sqrt(d) (eval.py's noisyLR, `renormalize_ys`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.seeds import generator_for
from .config import TaskConfig
from .tasks import random_orthogonal

SHIFT_STREAM = 601  # the shifts' own draws (sign patterns, subspaces, chosen examples, noise)


@dataclass
class ShiftedPrompts:
    """Examples xs (B, n, d), ys (B, n) and per position t the query queries[:, t] with label
    query_ys[:, t] (NaN where the shift defines no test at t), the weights w (B, d)."""

    xs: Tensor
    ys: Tensor
    queries: Tensor
    query_ys: Tensor
    w: Tensor


@dataclass(frozen=True)
class Shift:
    name: str
    eval_py: str  # the entry of Garg et al.'s src/eval.py it follows
    build: Callable[[Tensor, Tensor, float | None, torch.Generator], tuple[Tensor, Tensor]]  # (z, w) -> (xs, queries)
    default: float | None = None  # the value where the shift takes one
    label: Callable[[Tensor, Tensor, float | None, torch.Generator], Tensor] | None = None  # (x.w, w) -> labels
    replaces_query: bool = False  # each position's query is not its own example (a run per prefix without a cache)


def _signed(z: Tensor, g: torch.Generator) -> Tensor:
    signs = torch.randn(z.shape[0], 1, z.shape[2], generator=g).sign()
    return z.abs() * signs


def _random_quadrants(z, w, value, g):
    return _signed(z, g), z


def _opposite_quadrants(z, w, value, g):
    xs = _signed(z, g)
    return xs, -xs


def _orthogonal(z, w, value, g):
    _, n, d = z.shape
    queries = torch.full_like(z, float("nan"))
    for t in range(min(n, d)):
        q = z[:, t]
        if t:
            basis = torch.linalg.qr(z[:, :t].transpose(1, 2)).Q  # (B, d, t): orthonormal span of the examples
            q = q - torch.einsum("bdk,bk->bd", basis, torch.einsum("bdk,bd->bk", basis, q))
            q = q * (z[:, t].norm(dim=-1, keepdim=True) / q.norm(dim=-1, keepdim=True))
        queries[:, t] = q
    return z, queries


def _overlapping(z, w, value, g):
    queries = z.clone()
    for t in range(1, z.shape[1]):
        pick = torch.randint(0, t, (z.shape[0],), generator=g)
        queries[:, t] = z[torch.arange(z.shape[0]), pick]
    return z, queries


def _transform(eigenvalues: Tensor, g: torch.Generator) -> Tensor:
    """U diag(e) U^T with one random orthogonal U, normalised so that sum(e^2) = d (eval.py's
    `sample_transformation(..., normalize=True)`)."""
    d = len(eigenvalues)
    u = random_orthogonal(1, d, g)[0]
    return u @ torch.diag(eigenvalues) @ u.T * math.sqrt(d / float((eigenvalues**2).sum()))


def _half_subspace(z, w, value, g):
    d = z.shape[-1]
    e = torch.zeros(d)
    e[: d // 2] = 1
    xs = z @ _transform(e, g)
    return xs, xs


def _skewed(z, w, value, g):
    xs = z @ _transform(1 / (torch.arange(z.shape[-1]) + 1.0), g)
    return xs, xs


def _scale_x(z, w, value, g):
    xs = value * z
    return xs, xs


def _unchanged(z, w, value, g):
    return z, z


def _scale_y(y, w, value, g):
    return value * y


def _noisy(y, w, value, g):
    noisy = y + value * torch.randn(y.shape, generator=g)
    return noisy * math.sqrt(w.shape[-1]) / noisy.std()


SHIFTS = {
    s.name: s
    for s in (
        Shift("random_quadrants", "random_quadrants", _random_quadrants, replaces_query=True),
        Shift(
            "opposite_quadrants",
            "gen_opposite_quadrants (not in build_evals)",
            _opposite_quadrants,
            replaces_query=True,
        ),
        Shift("orthogonal_train_test", "orthogonal_train_test", _orthogonal, replaces_query=True),
        Shift("overlapping_train_test", "overlapping_train_test", _overlapping, replaces_query=True),
        Shift("half_subspace", "half_subspace", _half_subspace),
        Shift("skewed", "skewed", _skewed),
        Shift("scale_x", "scale-x=<s> (0.333, 0.5, 2, 3)", _scale_x, 2.0),
        Shift("scale_y", "scale-y=<s> (0.333, 0.5, 2, 3)", _unchanged, 2.0, _scale_y),
        Shift("noisy", "noisyLR (noise_std 1, renormalize_ys)", _unchanged, 1.0, _noisy),
    )
}


def parse_shift(text: str) -> tuple[str, float | None]:
    """ "name" or "name=value" (e.g. scale_x=3) -> (name, value), checked against SHIFTS."""
    name, _, raw = text.partition("=")
    if name not in SHIFTS:
        raise ConfigError(f"unknown shift {name!r}; known: {', '.join(SHIFTS)}")
    shift = SHIFTS[name]
    if not raw:
        return name, shift.default
    if shift.default is None:
        raise ConfigError(f"shift {name!r} takes no value (got {raw!r})")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"shift {name}: the value must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"shift {name}: the value must be a positive number, got {raw!r}")
    return name, value


def shifted_prompts(
    task: TaskConfig, shift: str, n_prompts: int, seed: int = 0, n_points: int | None = None, value: float | None = None
) -> ShiftedPrompts:
    """Prompts of a linear task under `shift` ("name" or "name=value"; `value` overrides the written
    one) (module docstring): z ~ N(0, I), w ~ N(0, tau^2 I) from the seed's evaluation stream, the
    shift's own draws from SHIFT_STREAM."""
    if task.name != "linear_regression" or task.covariance != "isotropic":
        raise ConfigError(
            f"the Garg et al. shifts apply to isotropic linear regression (this task: {task.name}, "
            f"{task.covariance} inputs)"
        )
    name, written = parse_shift(shift)  # "scale_x=3": its value, unless `value` is given
    spec = SHIFTS[name]
    value = written if value is None else value
    n = n_points or task.n_points
    g = generator_for(seed, SHIFT_STREAM)
    gen = generator_for(seed, SHIFT_STREAM + 1)
    z = torch.randn(n_prompts, n, task.n_dims, generator=gen)
    w = task.w_scale * torch.randn(n_prompts, task.n_dims, generator=gen)
    xs, queries = spec.build(z, w, value, g)
    ys = torch.einsum("bnd,bd->bn", xs, w)
    if spec.label is not None:
        ys = spec.label(ys, w, value, g)
    # a shift that keeps the queries asks each position's own example, with its (shifted) label
    query_ys = ys if queries is xs else torch.einsum("bnd,bd->bn", queries, w)
    finite = all(bool(torch.isfinite(t).all()) for t in (xs, ys))  # (queries a shift has none for are NaN)
    if not finite or any(bool(torch.isinf(t).any()) for t in (queries, query_ys)):
        raise ConfigError(
            f"shift {name}{'' if value is None else f' (value {value:g})'} makes the prompts overflow float32 "
            "(|x| or |y| beyond 3.4e38); "
            "use a smaller value"
        )
    return ShiftedPrompts(xs, ys, queries, query_ys, w)
