"""Conjugate gradient, BFGS and L-BFGS iterations on the least-squares objective.

Objective per prefix: f(w) = w^T S w / 2 - b^T w (least squares up to a constant), from w_0 = 0,
with exact line search (closed form for a quadratic: a = -g.p / p.S p). In exact arithmetic
BFGS (H_0 = I) and L-BFGS with exact line searches generate the same iterates as CG on a
quadratic; in floating point they drift apart once the problem is nearly solved.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import LearnerResult, as_float64, linear_result, prefix_moments
from .registry import register

KRYLOV_ITERATIONS = tuple(range(21))
TINY = 1e-30


def _matvec(s: Tensor, x: Tensor) -> Tensor:
    return (s @ x.unsqueeze(-1)).squeeze(-1)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1, keepdim=True)


def _exact_step(s: Tensor, g: Tensor, p: Tensor) -> Tensor:
    curv = _dot(p, _matvec(s, p))
    return torch.where(curv > TINY, -_dot(g, p) / curv.clamp_min(TINY), torch.zeros_like(curv))


def _collect(iterations: Sequence[int], name: str) -> list[int]:
    its = [int(k) for k in iterations]
    if any(k < 0 for k in its):
        raise ValueError(f"{name} iterations must be >= 0, got {its}")
    return its


@register("cg", defaults={"iterations": KRYLOV_ITERATIONS})
def cg(xs: Tensor, ys: Tensor, queries: Tensor | None = None, *,
       iterations: Sequence[int] = KRYLOV_ITERATIONS) -> LearnerResult:
    """Conjugate gradient on S w = X^T y from w_0 = 0 (Hestenes-Stiefel)."""
    its = _collect(iterations, "cg")
    xs, ys, queries = as_float64(xs, ys, queries)
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


@register("bfgs", defaults={"iterations": KRYLOV_ITERATIONS})
def bfgs(xs: Tensor, ys: Tensor, queries: Tensor | None = None, *,
         iterations: Sequence[int] = KRYLOV_ITERATIONS) -> LearnerResult:
    """BFGS with H_0 = I and exact line search: p = -H g, w += a p, then
    H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T with s = a p, y = S s, rho = 1/(y.s)."""
    its = _collect(iterations, "bfgs")
    xs, ys, queries = as_float64(xs, ys, queries)
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


@register("lbfgs", defaults={"iterations": KRYLOV_ITERATIONS, "memory": 3})
def lbfgs(xs: Tensor, ys: Tensor, queries: Tensor | None = None, *,
          iterations: Sequence[int] = KRYLOV_ITERATIONS, memory: int = 3) -> LearnerResult:
    """L-BFGS (two-loop recursion, H_0 = I, the last `memory` pairs) with exact line search."""
    its = _collect(iterations, "lbfgs")
    if memory < 1:
        raise ValueError(f"lbfgs memory must be >= 1, got {memory}")
    xs, ys, queries = as_float64(xs, ys, queries)
    s_mat, b = prefix_moments(xs, ys)
    w = torch.zeros_like(b)
    g = -b
    pairs: list[tuple[Tensor, Tensor, Tensor]] = []  # (s, y, rho)
    snaps = {0: w}
    for k in range(max(its, default=0)):
        q = g.clone()
        alphas = []
        for s_i, y_i, rho_i in reversed(pairs):
            a_i = rho_i * _dot(s_i, q)
            q = q - a_i * y_i
            alphas.append(a_i)
        for (s_i, y_i, rho_i), a_i in zip(pairs, reversed(alphas)):
            q = q + s_i * (a_i - rho_i * _dot(y_i, q))
        p = -q
        step = _exact_step(s_mat, g, p) * p
        y = _matvec(s_mat, step)
        ys_ = _dot(y, step)
        rho = torch.where(ys_ > TINY, 1 / ys_.clamp_min(TINY), torch.zeros_like(ys_))
        pairs = (pairs + [(step, y, rho)])[-memory:]
        w = w + step
        g = g + y
        snaps[k + 1] = w
    return linear_result("lbfgs", [{"iterations": k} for k in its], torch.stack([snaps[k] for k in its]), xs, queries)
