"""CG, BFGS and L-BFGS with the inexact (strong Wolfe) line searches of scipy.optimize, batched
over prompts and prefixes, on the least-squares objective f(w) = w^T S w / 2 - b^T w.

Fu et al. 2024 report that BFGS matches the trained transformers about as well as Newton while CG
and L-BFGS match worse. With exact line searches on a quadratic the three produce the same
iterates (krylov.py), so that ordering can only come from the line searches practical codes
use. Each function below follows one scipy method step for step, so that its iterates equal
`scipy.optimize.minimize(f, 0, jac=grad, method=...)`'s:

- `bfgs_wolfe` = method="BFGS": H_0 = I, p = -H g, Moré-Thuente search with c1 = 1e-4,
  c2 = 0.9, first trial step min(1, 2.02 (f_k - f_{k-1}) / g.p) (f_{-1} = f_0 + |g_0| / 2),
  inverse-Hessian update of Nocedal & Wright eq. 6.17 (rho = 1000 when y.s = 0, as scipy).
- `cg_wolfe` = method="CG": Polak-Ribière+ (beta = max(0, y.g_new / g.g)), the same search with
  c2 = 0.4, a step accepted only if the new direction is a descent direction
  (p.g <= -0.01 g.g, Gilbert & Nocedal 1992), as scipy's `descent_condition`.
- `lbfgs_wolfe` = method="L-BFGS-B" without bounds: the two-loop recursion (N&W Alg. 7.4) with
  H_0 = (s.y / y.y) I from the newest pair, `memory` pairs (scipy's maxcor), its own
  Moré-Thuente search (ftol 1e-3, gtol 0.9, xtol 0.1, steps in [0, 1e10]) from a first trial
  of 1/|p| at the first iteration and 1 after; a pair is skipped when y.s <= eps (-g.p) a.

BFGS and CG fall back, as scipy does, to Nocedal & Wright Alg. 3.5/3.6 (`line_search_wolfe2`)
where the Moré-Thuente search fails or CG's descent condition rejects its step. Where both
fail the element takes no step (it keeps its iterate); each function returns, per element, how
many searches failed while the gradient was not yet negligible (tested: none on random
prompts; failures happen only at the minimum, where scipy stops). Where L-BFGS skips a pair
for some elements only, those elements keep fewer pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .line_search import more_thuente, wolfe2

EPS = torch.finfo(torch.float64).eps


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1)


def _matvec(m: Tensor, v: Tensor) -> Tensor:
    return (m @ v.unsqueeze(-1)).squeeze(-1)


def _objective(w: Tensor, s_mat: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    sw = _matvec(s_mat, w)
    return 0.5 * _dot(w, sw) - _dot(b, w), sw - b


def _search(
    s_mat: Tensor,
    b: Tensor,
    w: Tensor,
    f: Tensor,
    g: Tensor,
    p: Tensor,
    step0: Tensor,
    *,
    ftol: float,
    gtol: float,
    xtol: float = 1e-14,
    stpmin: float = 1e-100,
    stpmax: float = 1e100,
    extra: Callable[[Tensor], Tensor] | None = None,
    fallback: bool = False,
):
    """Line search along p from w for every element (any leading shape): (alpha, f_new, ok).

    Moré-Thuente first; with `fallback` (scipy's `_line_search_wolfe12`), elements whose search
    failed or whose step fails `extra` are searched again with Nocedal & Wright Alg. 3.5/3.6."""
    shape, d = f.shape, w.shape[-1]
    w_, p_, b_ = w.reshape(-1, d), p.reshape(-1, d), b.reshape(-1, d)
    sw, sp = _matvec(s_mat, w).reshape(-1, d), _matvec(s_mat, p).reshape(-1, d)

    def phi_at(a: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        a = a.unsqueeze(-1)
        x, sx = w_[index] + a * p_[index], sw[index] + a * sp[index]
        return 0.5 * _dot(x, sx) - _dot(b_[index], x), _dot(sx - b_[index], p_[index])

    def extra_flat(a: Tensor) -> Tensor:
        return torch.ones_like(a, dtype=torch.bool) if extra is None else extra(a.reshape(shape)).reshape(-1)

    f0, d0, a0 = f.reshape(-1), _dot(g, p).reshape(-1), step0.reshape(-1)
    res = more_thuente(phi_at, f0, d0, a0, ftol=ftol, gtol=gtol, xtol=xtol, stpmin=stpmin, stpmax=stpmax)
    if fallback:
        redo = ~(res.ok & extra_flat(res.step))
        if bool(redo.any()):
            sub = redo.nonzero().squeeze(-1)

            def extra_sub(a: Tensor) -> Tensor:
                full = torch.zeros_like(f0)
                full[sub] = a
                return extra_flat(full)[sub]

            again = wolfe2(
                lambda a: phi_at(a, sub), extra_sub, f0[sub], d0[sub], a0[sub], c1=ftol, c2=gtol, amax=stpmax
            )
            res.step[sub], res.value[sub], res.ok[sub] = again.step, again.value, again.ok
    return res.step.reshape(shape), res.value.reshape(shape), res.ok.reshape(shape)


def _at_minimum(g: Tensor, b: Tensor, rtol: float = 1e-6, gtol: float = 1e-5) -> Tensor:
    """Where scipy would already have stopped (its default gtol: |g|_inf <= 1e-5) or the gradient is
    negligible against X^T y: a failed search there ends the run, as in scipy, and is not counted."""
    size = g.abs().amax(-1)
    return (size <= gtol) | (size <= rtol * b.abs().amax(-1))


def _first_trial(f: Tensor, f_prev: Tensor, slope: Tensor) -> Tensor:
    """scipy's scalar_search_wolfe1 initial step: min(1, 1.01 * 2 (f - f_prev) / slope), 1 if < 0."""
    guess = torch.where(slope != 0, 1.01 * 2 * (f - f_prev) / torch.where(slope != 0, slope, 1.0), 1.0)
    guess = guess.clamp(max=1.0)
    return torch.where(guess < 0, torch.ones_like(guess), guess)


def bfgs_wolfe(s_mat: Tensor, b: Tensor, n_iter: int, snapshot: Callable[[int, Tensor], None]) -> Tensor:
    """scipy's BFGS from w = 0; calls snapshot(k, w_k) for k = 0..n_iter; returns failed searches per element."""
    d = b.shape[-1]
    eye = torch.eye(d, dtype=b.dtype, device=b.device)
    h = eye.expand(*b.shape[:-1], d, d).clone()
    w = torch.zeros_like(b)
    f, g = _objective(w, s_mat, b)
    f_prev = f + g.norm(dim=-1) / 2
    failed = torch.zeros(b.shape[:-1], dtype=torch.long, device=b.device)
    snapshot(0, w)
    for k in range(1, n_iter + 1):
        g_start = g
        p = -_matvec(h, g)
        alpha, f_new, ok = _search(
            s_mat, b, w, f, g, p, _first_trial(f, f_prev, _dot(g, p)), fallback=True, ftol=1e-4, gtol=0.9
        )
        step = torch.where(ok.unsqueeze(-1), alpha.unsqueeze(-1) * p, torch.zeros_like(p))
        w = w + step
        g_new = _objective(w, s_mat, b)[1]
        y = g_new - g
        ys = _dot(y, step)
        rho = torch.where(ys == 0, torch.full_like(ys, 1000.0), 1 / torch.where(ys == 0, 1.0, ys))[..., None, None]
        left = eye - rho * step.unsqueeze(-1) * y.unsqueeze(-2)
        right = eye - rho * y.unsqueeze(-1) * step.unsqueeze(-2)
        h = torch.where(ok[..., None, None], left @ (h @ right) + rho * step.unsqueeze(-1) * step.unsqueeze(-2), h)
        f_prev, f, g = torch.where(ok, f, f_prev), torch.where(ok, f_new, f), g_new
        failed += (~ok & ~_at_minimum(g_start, b)).long()
        snapshot(k, w)
    return failed


def cg_wolfe(
    s_mat: Tensor, b: Tensor, n_iter: int, snapshot: Callable[[int, Tensor], None], gtol_stop: float = 1e-5
) -> Tensor:
    """scipy's nonlinear CG (Polak-Ribière+) from w = 0; see bfgs_wolfe for the interface."""
    w = torch.zeros_like(b)
    f, g = _objective(w, s_mat, b)
    f_prev = f + g.norm(dim=-1) / 2
    p = -g
    failed = torch.zeros(b.shape[:-1], dtype=torch.long, device=b.device)
    snapshot(0, w)
    for k in range(1, n_iter + 1):
        g_start = g

        def next_direction(alpha: Tensor, w=w, g=g, p=p) -> tuple[Tensor, Tensor, Tensor]:
            w_new = w + alpha.unsqueeze(-1) * p
            g_new = _objective(w_new, s_mat, b)[1]
            beta = (_dot(g_new - g, g_new) / _dot(g, g).clamp_min(1e-300)).clamp_min(0)
            return w_new, g_new, -g_new + beta.unsqueeze(-1) * p

        def descent(alpha: Tensor, next_direction=next_direction) -> Tensor:
            _, g_new, p_new = next_direction(alpha)
            return (g_new.abs().amax(-1) <= gtol_stop) | (_dot(p_new, g_new) <= -0.01 * _dot(g_new, g_new))

        alpha, f_new, ok = _search(
            s_mat, b, w, f, g, p, _first_trial(f, f_prev, _dot(g, p)), extra=descent, fallback=True, ftol=1e-4, gtol=0.4
        )
        w_new, g_new, p_new = next_direction(alpha)
        keep = ok.unsqueeze(-1)
        w, g, p = torch.where(keep, w_new, w), torch.where(keep, g_new, g), torch.where(keep, p_new, p)
        f_prev, f = torch.where(ok, f, f_prev), torch.where(ok, f_new, f)
        failed += (~ok & ~_at_minimum(g_start, b)).long()
        snapshot(k, w)
    return failed


def two_loop(g: Tensor, pairs: list[tuple[Tensor, Tensor, Tensor]], gamma: Tensor) -> Tensor:
    """H g by Nocedal & Wright Alg. 7.4 with H_0 = gamma I; pairs (s, y, rho), rho = 0 for skipped ones."""
    q, alphas = g.clone(), []
    for s_i, y_i, rho_i in reversed(pairs):
        a_i = rho_i * _dot(s_i, q)
        q = q - a_i.unsqueeze(-1) * y_i
        alphas.append(a_i)
    r = gamma.unsqueeze(-1) * q
    for (s_i, y_i, rho_i), a_i in zip(pairs, reversed(alphas)):
        r = r + s_i * (a_i - rho_i * _dot(y_i, r)).unsqueeze(-1)
    return r


def lbfgs_wolfe(
    s_mat: Tensor, b: Tensor, n_iter: int, snapshot: Callable[[int, Tensor], None], memory: int = 10
) -> Tensor:
    """scipy's L-BFGS-B without bounds from w = 0; see bfgs_wolfe for the interface."""
    w = torch.zeros_like(b)
    f, g = _objective(w, s_mat, b)
    gamma = torch.ones_like(f)
    pairs: list[tuple[Tensor, Tensor, Tensor]] = []
    failed = torch.zeros(b.shape[:-1], dtype=torch.long, device=b.device)
    snapshot(0, w)
    for k in range(1, n_iter + 1):
        g_start = g
        p = -two_loop(g, pairs, gamma)
        first = (1 / p.norm(dim=-1).clamp_min(1e-300)).clamp(max=1e10) if k == 1 else torch.ones_like(f)
        alpha, f_new, ok = _search(s_mat, b, w, f, g, p, first, ftol=1e-3, gtol=0.9, xtol=0.1, stpmin=0.0, stpmax=1e10)
        step = torch.where(ok.unsqueeze(-1), alpha.unsqueeze(-1) * p, torch.zeros_like(p))
        w = w + step
        g_new = _objective(w, s_mat, b)[1]
        y = g_new - g
        ys = _dot(y, step)
        keep = ok & (ys > EPS * -_dot(g, p) * alpha)
        rho = torch.where(keep, 1 / torch.where(keep, ys, 1.0), torch.zeros_like(ys))
        pairs = (pairs + [(step, y, rho)])[-memory:]
        gamma = torch.where(keep, ys / torch.where(keep, _dot(y, y), 1.0), gamma)
        f, g = torch.where(ok, f_new, f), g_new
        failed += (~ok & ~_at_minimum(g_start, b)).long()
        snapshot(k, w)
    return failed
