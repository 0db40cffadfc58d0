"""Conjugate gradient, BFGS and L-BFGS iterations on the least-squares objective.

Objective per prefix: f(w) = w^T S w / 2 - b^T w (least squares up to a constant), from w_0 = 0.
`line_search="exact"` (default): the exact step along each direction (closed form for a
quadratic: a = -g.p / p.S p). In exact arithmetic BFGS (H_0 = I) and L-BFGS with exact line
searches generate the same iterates as CG on a quadratic; in floating point they drift apart
once the problem is nearly solved. `line_search="wolfe"`: scipy.optimize's methods with their
inexact strong-Wolfe searches (probe/learners/wolfe.py), whose iterates differ between methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .base import LearnerResult, as_float64, linear_result, prefix_moments
from .registry import register
from .wolfe import bfgs_wolfe, cg_wolfe, lbfgs_wolfe, two_loop

log = logging.getLogger(__name__)

KRYLOV_ITERATIONS = tuple(range(21))
TINY = 1e-30


def _matvec(s: Tensor, x: Tensor) -> Tensor:
    return (s @ x.unsqueeze(-1)).squeeze(-1)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1, keepdim=True)


def _exact_step(s: Tensor, g: Tensor, p: Tensor) -> Tensor:
    curv = _dot(p, _matvec(s, p))
    return torch.where(curv > TINY, -_dot(g, p) / curv.clamp_min(TINY), torch.zeros_like(curv))


def _run_wolfe(
    name: str, method: Callable, xs: Tensor, ys: Tensor, queries: Tensor | None, its: list[int], **options
) -> LearnerResult:
    """Iterates of one scipy-faithful method at the requested iteration counts; warns when a line
    search failed away from the minimum (the element then kept its iterate)."""
    s_mat, b = prefix_moments(xs, ys)
    snaps: dict[int, Tensor] = {}
    wanted = set(its)
    failed = method(
        s_mat, b, max(its, default=0), lambda k, w: snaps.__setitem__(k, w) if k in wanted else None, **options
    )
    if int(failed.sum()):
        log.warning(
            "%s (wolfe): %d line searches failed before the gradient vanished; those prefixes kept their iterate",
            name,
            int(failed.sum()),
        )
    return linear_result(name, [{"iterations": k} for k in its], torch.stack([snaps[k] for k in its]), xs, queries)


def _collect(iterations: Sequence[int]) -> list[int]:
    return [int(k) for k in iterations]


@register("cg", label="conjugate gradient", unit="steps")
def cg(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    iterations: Sequence[int] = KRYLOV_ITERATIONS,
    line_search: str = "exact",
) -> LearnerResult:
    """Conjugate gradient on S w = X^T y from w_0 = 0 (Hestenes-Stiefel; with line_search="wolfe",
    scipy's nonlinear CG: Polak-Ribière+ with strong Wolfe searches)."""
    its = _collect(iterations)
    xs, ys, queries = as_float64(xs, ys, queries)
    if line_search == "wolfe":
        return _run_wolfe("cg", cg_wolfe, xs, ys, queries, its)
    s, b = prefix_moments(xs, ys)
    w = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = _dot(r, r)
    snaps = {0: w}
    for k in range(max(its, default=0)):
        sp = _matvec(s, p)
        curv = _dot(p, sp)
        a = torch.where(curv > TINY, rr / curv.clamp_min(TINY), torch.zeros_like(curv))
        w = w + a * p
        r = r - a * sp
        rr_new = _dot(r, r)
        beta = torch.where(rr > TINY, rr_new / rr.clamp_min(TINY), torch.zeros_like(rr))
        p = r + beta * p
        rr = rr_new
        snaps[k + 1] = w
    return linear_result("cg", [{"iterations": k} for k in its], torch.stack([snaps[k] for k in its]), xs, queries)


@register("bfgs", label="BFGS", unit="steps")
def bfgs(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    iterations: Sequence[int] = KRYLOV_ITERATIONS,
    line_search: str = "exact",
) -> LearnerResult:
    """BFGS with H_0 = I: p = -H g, w += a p, then H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T
    with s = a p, y = S s, rho = 1/(y.s) (N&W eq. 6.17); a exact, or scipy's Wolfe search."""
    its = _collect(iterations)
    xs, ys, queries = as_float64(xs, ys, queries)
    if line_search == "wolfe":
        return _run_wolfe("bfgs", bfgs_wolfe, xs, ys, queries, its)
    s_mat, b = prefix_moments(xs, ys)
    d = xs.shape[-1]
    eye = torch.eye(d, dtype=xs.dtype, device=xs.device)
    h = eye.expand(*b.shape[:-1], d, d).clone()
    w = torch.zeros_like(b)
    g = -b
    snaps = {0: w}
    for k in range(max(its, default=0)):
        p = -_matvec(h, g)
        step = _exact_step(s_mat, g, p) * p
        y = _matvec(s_mat, step)
        ys_ = _dot(y, step)
        ok = ys_ > TINY
        rho = torch.where(ok, 1 / ys_.clamp_min(TINY), torch.zeros_like(ys_)).unsqueeze(-1)
        left = eye - rho * step.unsqueeze(-1) * y.unsqueeze(-2)
        h_new = left @ h @ left.transpose(-1, -2) + rho * step.unsqueeze(-1) * step.unsqueeze(-2)
        h = torch.where(ok.unsqueeze(-1), h_new, h)
        w = w + step
        g = g + y
        snaps[k + 1] = w
    return linear_result("bfgs", [{"iterations": k} for k in its], torch.stack([snaps[k] for k in its]), xs, queries)


@register("lbfgs", label="L-BFGS")
def lbfgs(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    iterations: Sequence[int] = KRYLOV_ITERATIONS,
    memory: int = 3,
    line_search: str = "exact",
) -> LearnerResult:
    """L-BFGS (two-loop recursion, the last `memory` pairs): H_0 = I with exact line search, or
    scipy's L-BFGS-B without bounds (H_0 = (s.y / y.y) I, its Moré-Thuente search) with "wolfe"."""
    its = _collect(iterations)
    xs, ys, queries = as_float64(xs, ys, queries)
    if line_search == "wolfe":
        return _run_wolfe("lbfgs", lbfgs_wolfe, xs, ys, queries, its, memory=memory)
    s_mat, b = prefix_moments(xs, ys)
    w = torch.zeros_like(b)
    g = -b
    pairs: list[tuple[Tensor, Tensor, Tensor]] = []  # (s, y, rho)
    snaps = {0: w}
    for k in range(max(its, default=0)):
        p = -two_loop(g, pairs, torch.ones_like(g[..., 0]))  # H_0 = I
        step = _exact_step(s_mat, g, p) * p
        y = _matvec(s_mat, step)
        ys_ = _dot(y, step)
        rho = torch.where(ys_ > TINY, 1 / ys_.clamp_min(TINY), torch.zeros_like(ys_))
        pairs = (pairs + [(step, y, rho.squeeze(-1))])[-memory:]
        w = w + step
        g = g + y
        snaps[k + 1] = w
    return linear_result("lbfgs", [{"iterations": k} for k in its], torch.stack([snaps[k] for k in its]), xs, queries)
