"""Batched inexact line searches: the Moré-Thuente search (MINPACK-2 `dcsrch` / `dcstep`) that
scipy.optimize runs inside BFGS and CG (`line_search_wolfe1`) and inside L-BFGS-B, for many
one-dimensional problems at once.

Moré & Thuente (1994), "Line search algorithms with guaranteed sufficient decrease", find a step
satisfying the strong Wolfe conditions (Nocedal & Wright eqs. 3.7a-b)

    phi(a) <= phi(0) + ftol * a * phi'(0)        and        |phi'(a)| <= gtol * |phi'(0)|

by safeguarded cubic / quadratic interpolation on an interval that brackets a minimiser. This is
the same state machine as scipy's `_dcsrch.py` (a line-by-line port of MINPACK-2), written with
`torch.where` over a batch: every element takes exactly the branch the scalar code would, so
the accepted steps equal scipy's up to floating-point rounding (tested against scipy's DCSRCH).
Elements finish independently (converged, or failed with a warning where scipy returns None).
`wolfe2` is scipy's fallback, `scalar_search_wolfe2`: Nocedal & Wright Alg. 3.5 (bracketing
by doubling) and Alg. 3.6 (zoom by cubic, then quadratic interpolation, then bisection), with
scipy's constants (interpolants kept 0.2 / 0.1 of the interval away from its ends; at most 10
bracketing and 11 zoom steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

XTRAPL, XTRAPU, P5, P66 = 1.1, 4.0, 0.5, 0.66


@dataclass
class SearchResult:
    step: Tensor  # accepted steps (0 where the search failed)
    value: Tensor  # phi at the accepted step (phi(0) where it failed)
    ok: Tensor  # bool: the search converged


def _cubic_gamma(theta: Tensor, da: Tensor, db: Tensor, clamp: bool = False) -> Tensor:
    s = torch.maximum(theta.abs(), torch.maximum(da.abs(), db.abs()))
    inner = (theta / s) ** 2 - (da / s) * (db / s)
    return s * torch.sqrt(inner.clamp_min(0) if clamp else inner)


def dcstep(stx, fx, dx, sty, fy, dy, stp, fp, dp, brackt, stpmin, stpmax):
    """One safeguarded step of Moré-Thuente (MINPACK-2 dcstep), elementwise over a batch; the four
    cases of the paper's Section 4 are computed everywhere and selected with masks."""
    sgnd = torch.sign(dp) * torch.sign(dx)
    theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
    case1, case2 = fp > fx, ~(fp > fx) & (sgnd < 0)
    case3 = ~case1 & ~case2 & (dp.abs() < dx.abs())

    # case 1: higher function value; the minimum is bracketed
    g1 = _cubic_gamma(theta, dx, dp)
    g1 = torch.where(stp < stx, -g1, g1)
    stpc1 = stx + ((g1 - dx) + theta) / (((g1 - dx) + g1) + dp) * (stp - stx)
    stpq1 = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx)
    f1 = torch.where((stpc1 - stx).abs() <= (stpq1 - stx).abs(), stpc1, stpc1 + (stpq1 - stpc1) / 2.0)

    # case 2: lower value, derivatives of opposite sign; bracketed
    g2 = _cubic_gamma(theta, dx, dp)
    g2 = torch.where(stp > stx, -g2, g2)
    stpc2 = stp + ((g2 - dp) + theta) / (((g2 - dp) + g2) + dx) * (stx - stp)
    stpq = stp + (dp / (dp - dx)) * (stx - stp)
    f2 = torch.where((stpc2 - stp).abs() > (stpq - stp).abs(), stpc2, stpq)

    # case 3: lower value, same sign, derivative magnitude decreases
    g3 = _cubic_gamma(theta, dx, dp, clamp=True)
    g3 = torch.where(stp > stx, -g3, g3)
    r3 = ((g3 - dp) + theta) / ((g3 + (dx - dp)) + g3)
    stpc3 = torch.where((r3 < 0) & (g3 != 0), stp + r3 * (stx - stp), torch.where(stp > stx, stpmax, stpmin))
    closer = torch.where((stpc3 - stp).abs() < (stpq - stp).abs(), stpc3, stpq)
    capped = torch.where(
        stp > stx, torch.minimum(stp + P66 * (sty - stp), closer), torch.maximum(stp + P66 * (sty - stp), closer)
    )
    farther = torch.where((stpc3 - stp).abs() > (stpq - stp).abs(), stpc3, stpq)
    f3 = torch.where(brackt, capped, torch.clamp(farther, stpmin, stpmax))

    # case 4: lower value, same sign, derivative magnitude does not decrease
    theta4 = 3.0 * (fp - fy) / (sty - stp) + dy + dp
    g4 = _cubic_gamma(theta4, dy, dp)
    g4 = torch.where(stp > sty, -g4, g4)
    stpc4 = stp + ((g4 - dp) + theta4) / (((g4 - dp) + g4) + dy) * (sty - stp)
    f4 = torch.where(brackt, stpc4, torch.where(stp > stx, stpmax, stpmin))

    stpf = torch.where(case1, f1, torch.where(case2, f2, torch.where(case3, f3, f4)))
    brackt = brackt | case1 | case2
    move_y = case1 | (~case1 & (sgnd < 0))
    new_sty = torch.where(case1, stp, torch.where(move_y, stx, sty))
    new_fy = torch.where(case1, fp, torch.where(move_y, fx, fy))
    new_dy = torch.where(case1, dp, torch.where(move_y, dx, dy))
    new_stx = torch.where(case1, stx, stp)
    new_fx = torch.where(case1, fx, fp)
    new_dx = torch.where(case1, dx, dp)
    return new_stx, new_fx, new_dx, new_sty, new_fy, new_dy, stpf, brackt


def more_thuente(
    phi: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    phi0: Tensor,
    dphi0: Tensor,
    step0: Tensor,
    *,
    ftol: float,
    gtol: float,
    xtol: float,
    stpmin: float,
    stpmax: float,
    maxiter: int = 100,
) -> SearchResult:
    """Batched `dcsrch`: phi(steps, index) -> (phi, phi') of the elements `index` at `steps`;
    phi0, dphi0, step0 (N,). Finished elements leave the working set, so the cost follows the
    elements still searching. Elements with phi'(0) >= 0 fail at once (scipy: "ERROR: INITIAL G
    .GE. ZERO"). Longer than 60 lines on purpose: one loop mirroring scipy's state machine step
    for step, so the two can be read side by side (and are tested against each other)."""
    best, best_f = torch.zeros_like(step0), phi0.clone()
    done_ok = torch.zeros_like(phi0, dtype=torch.bool)
    index = (dphi0 < 0).nonzero().squeeze(-1)
    f0, d0, stp = phi0[index], dphi0[index], step0[index].clone()
    gtest = ftol * d0
    width = torch.full_like(stp, stpmax - stpmin)
    state = [
        torch.zeros_like(stp),
        f0.clone(),
        d0.clone(),
        torch.zeros_like(stp),
        f0.clone(),
        d0.clone(),
        width,
        width / P5,
        torch.zeros_like(stp),
        stp + XTRAPU * stp,
    ]  # stx fx gx sty fy gy width width1 stmin stmax
    brackt, stage1 = torch.zeros_like(stp, dtype=torch.bool), torch.ones_like(stp, dtype=torch.bool)
    for _ in range(maxiter):
        if index.numel() == 0:
            break
        f, g = phi(stp, index)
        stx, fx, gx, sty, fy, gy, width, width1, stmin, stmax = state
        ftest = f0 + stp * gtest
        stage1 = stage1 & ~((f <= ftest) & (g >= 0))
        warn = (
            (brackt & ((stp <= stmin) | (stp >= stmax)))
            | (brackt & (stmax - stmin <= xtol * stmax))
            | ((stp == stpmax) & (f <= ftest) & (g <= gtest))
            | ((stp == stpmin) & ((f > ftest) | (g >= gtest)))
        )
        converged = (f <= ftest) & (g.abs() <= gtol * -d0)
        best[index[converged]], best_f[index[converged]] = stp[converged], f[converged]
        done_ok[index[converged]] = True
        new = _advance(
            stx,
            fx,
            gx,
            sty,
            fy,
            gy,
            stp,
            f,
            g,
            brackt,
            stmin,
            stmax,
            width,
            width1,
            stage1 & (f <= fx) & (f > ftest),
            gtest,
            xtol,
            stpmin,
            stpmax,
        )
        keep = ~converged & ~warn & torch.isfinite(new[11])  # a non-finite step ends it with a warning
        state = [v[keep] for v in new[:10]]
        brackt, stp, stage1 = new[10][keep], new[11][keep], stage1[keep]
        index, f0, d0, gtest = index[keep], f0[keep], d0[keep], gtest[keep]
    return SearchResult(best, best_f, done_ok)


def _advance(
    stx, fx, gx, sty, fy, gy, stp, f, g, brackt, stmin, stmax, width, width1, mod, gtest, xtol, stpmin, stpmax
):
    """The part of one dcsrch call after the convergence tests: a dcstep (on the modified function
    psi(a) = phi(a) - ftol a phi'(0) where `mod`), bisection when the interval shrinks too slowly,
    the new extrapolation bounds and the safeguards. Returns the new state."""

    def shift(v, st):
        return torch.where(mod, v - st * gtest, v)

    def dshift(v):
        return torch.where(mod, v - gtest, v)

    n_stx, n_fx, n_gx, n_sty, n_fy, n_gy, n_stp, n_brackt = dcstep(
        stx,
        shift(fx, stx),
        dshift(gx),
        sty,
        shift(fy, sty),
        dshift(gy),
        stp,
        shift(f, stp),
        dshift(g),
        brackt,
        stmin,
        stmax,
    )
    n_fx = torch.where(mod, n_fx + n_stx * gtest, n_fx)
    n_fy = torch.where(mod, n_fy + n_sty * gtest, n_fy)
    n_gx = torch.where(mod, n_gx + gtest, n_gx)
    n_gy = torch.where(mod, n_gy + gtest, n_gy)
    bisect = n_brackt & ((n_sty - n_stx).abs() >= P66 * width1)
    n_stp = torch.where(bisect, n_stx + P5 * (n_sty - n_stx), n_stp)
    n_width1 = torch.where(n_brackt, width, width1)
    n_width = torch.where(n_brackt, (n_sty - n_stx).abs(), width)
    n_stmin = torch.where(n_brackt, torch.minimum(n_stx, n_sty), n_stp + XTRAPL * (n_stp - n_stx))
    n_stmax = torch.where(n_brackt, torch.maximum(n_stx, n_sty), n_stp + XTRAPU * (n_stp - n_stx))
    n_stp = n_stp.clamp(stpmin, stpmax)
    stuck = n_brackt & (((n_stp <= n_stmin) | (n_stp >= n_stmax)) | (n_stmax - n_stmin <= xtol * n_stmax))
    n_stp = torch.where(stuck, n_stx, n_stp)
    return n_stx, n_fx, n_gx, n_sty, n_fy, n_gy, n_width, n_width1, n_stmin, n_stmax, n_brackt, n_stp


def _cubicmin(a, fa, fpa, b, fb, c, fc) -> tuple[Tensor, Tensor]:
    """Minimiser of the cubic through (a, fa), (b, fb), (c, fc) with slope fpa at a, as scipy's
    `_cubicmin` computes it; (value, ok), ok False where scipy's would raise or be non-finite."""
    import numpy as np

    C, db, dc = fpa, b - a, c - a
    denom = (db * dc) ** 2 * (db - dc)
    u, v = fb - fa - C * db, fc - fa - C * dc
    # scipy forms [A, B] with np.dot, i.e. BLAS with fused multiply-adds; on an exact quadratic A
    # is rounding noise, so the same BLAS product (np.matmul) is used to get the same steps
    d1 = torch.stack((torch.stack((dc**2, -(db**2)), -1), torch.stack((-(dc**3), db**3), -1)), -2)
    both = np.matmul(d1.detach().cpu().numpy(), torch.stack((u, v), -1).detach().cpu().numpy()[..., None])[..., 0]
    A, B = (torch.from_numpy(both[..., i]).to(a.device) / denom for i in range(2))
    radical = B * B - 3 * A * C
    xmin = a + (-B + torch.sqrt(radical)) / (3 * A)
    ok = (denom != 0) & (A != 0) & (radical >= 0) & torch.isfinite(A) & torch.isfinite(B) & torch.isfinite(xmin)
    return xmin, ok


def _quadmin(a, fa, fpa, b, fb) -> tuple[Tensor, Tensor]:
    """Minimiser of the quadratic through (a, fa), (b, fb) with slope fpa at a (scipy's `_quadmin`)."""
    db = b - a
    B = (fb - fa - fpa * db) / (db * db)
    xmin = a - fpa / (2.0 * B)
    return xmin, (db != 0) & (B != 0) & torch.isfinite(B) & torch.isfinite(xmin)


@dataclass
class _Zoom:
    """Nocedal & Wright Alg. 3.6 state per element (scipy's `_zoom`)."""

    lo: Tensor
    hi: Tensor
    f_lo: Tensor
    f_hi: Tensor
    d_lo: Tensor
    rec: Tensor
    f_rec: Tensor
    i: Tensor


def _zoom_trial(z: _Zoom) -> Tensor:
    """The next trial step: cubic interpolation (not on the first zoom step), else quadratic, else bisection,
    each kept only inside the interval shrunk by 0.2 / 0.1 of its length."""
    dalpha = z.hi - z.lo
    a, b = torch.minimum(z.lo, z.hi), torch.maximum(z.lo, z.hi)
    cubic, ok_c = _cubicmin(z.lo, z.f_lo, z.d_lo, z.hi, z.f_hi, z.rec, z.f_rec)
    ok_c = ok_c & (z.i > 0) & ~(cubic > b - 0.2 * dalpha) & ~(cubic < a + 0.2 * dalpha)
    quad, ok_q = _quadmin(z.lo, z.f_lo, z.d_lo, z.hi, z.f_hi)
    ok_q = ok_q & ~(quad > b - 0.1 * dalpha) & ~(quad < a + 0.1 * dalpha)
    return torch.where(ok_c, cubic, torch.where(ok_q, quad, z.lo + 0.5 * dalpha))


def wolfe2(
    phi: Callable[[Tensor], tuple[Tensor, Tensor]],
    extra: Callable[[Tensor], Tensor],
    phi0: Tensor,
    dphi0: Tensor,
    step0: Tensor,
    *,
    c1: float,
    c2: float,
    amax: float,
    maxiter: int = 10,
) -> SearchResult:
    """Batched `scalar_search_wolfe2` (Nocedal & Wright Alg. 3.5 with the zoom of Alg. 3.6), scipy's
    fallback when the Moré-Thuente search fails; `phi(steps)` and `extra(steps)` (scipy's
    extra_condition) evaluate every element. One function, as scipy writes it, so that the
    bracketing and zoom branches can be checked against scipy's line by line."""
    a0, a1 = torch.zeros_like(step0), step0.clamp(max=amax)
    f_a0, d_a0, f_a1 = phi0.clone(), dphi0.clone(), phi(step0.clamp(max=amax))[0]
    bracketing = torch.ones_like(phi0, dtype=torch.bool)
    zooming, ok = torch.zeros_like(bracketing), torch.zeros_like(bracketing)
    best, best_f = torch.zeros_like(step0), phi0.clone()
    zoom = _Zoom(
        a0.clone(),
        a1.clone(),
        f_a0.clone(),
        f_a1.clone(),
        d_a0.clone(),
        a0.clone(),
        phi0.clone(),
        torch.zeros_like(a0, dtype=torch.long),
    )
    for i in range(maxiter):
        bracketing = bracketing & (a1 != 0) & ~(a0 > amax)
        high = bracketing & ((f_a1 > phi0 + c1 * a1 * dphi0) | ((f_a1 >= f_a0) & (i > 0)))
        f1, d1 = phi(a1)
        accept = bracketing & ~high & (d1.abs() <= -c2 * dphi0) & extra(a1)
        turn = bracketing & ~high & ~accept & (d1 >= 0)
        best, best_f = torch.where(accept, a1, best), torch.where(accept, f1, best_f)
        ok = ok | accept
        starts = high | turn  # zoom(alpha0, alpha1, ...) when high, zoom(alpha1, alpha0, ...) when turning
        for field_name, when_high, when_turn in (
            ("lo", a0, a1),
            ("hi", a1, a0),
            ("f_lo", f_a0, f1),
            ("f_hi", f_a1, f_a0),
            ("d_lo", d_a0, d1),
        ):
            setattr(
                zoom, field_name, torch.where(high, when_high, torch.where(turn, when_turn, getattr(zoom, field_name)))
            )
        zoom.rec, zoom.f_rec = torch.where(starts, 0.0, zoom.rec), torch.where(starts, phi0, zoom.f_rec)
        zooming = zooming | starts
        bracketing = bracketing & ~starts & ~accept
        grow = bracketing
        a0, f_a0, d_a0 = torch.where(grow, a1, a0), torch.where(grow, f1, f_a0), torch.where(grow, d1, d_a0)
        a1 = torch.where(grow, (2 * a1).clamp(max=amax), a1)
        f_a1 = torch.where(grow, phi(a1)[0], f_a1)
    # the bracketing loop ran out: scipy returns the last alpha1 (with a warning)
    best = torch.where(bracketing, a1, best)
    best_f = torch.where(bracketing, f_a1, best_f)
    ok = ok | bracketing
    return _run_zoom(phi, extra, zoom, zooming, phi0, dphi0, c1, c2, SearchResult(best, best_f, ok))


def _run_zoom(
    phi,
    extra,
    z: _Zoom,
    zooming: Tensor,
    phi0: Tensor,
    dphi0: Tensor,
    c1: float,
    c2: float,
    result: SearchResult,
    maxiter: int = 10,
) -> SearchResult:
    best, best_f, ok = result.step, result.value, result.ok
    for _ in range(maxiter + 1):
        if not bool(zooming.any()):
            break
        a_j = _zoom_trial(z)
        f_j, d_j = phi(a_j)
        high = zooming & ((f_j > phi0 + c1 * a_j * dphi0) | (f_j >= z.f_lo))
        low = zooming & ~high
        accept = low & (d_j.abs() <= -c2 * dphi0) & extra(a_j)
        best, best_f, ok = torch.where(accept, a_j, best), torch.where(accept, f_j, best_f), ok | accept
        move = low & ~accept
        flip = move & (d_j * (z.hi - z.lo) >= 0)
        new_rec = torch.where(high | flip, z.hi, torch.where(move, z.lo, z.rec))
        new_f_rec = torch.where(high | flip, z.f_hi, torch.where(move, z.f_lo, z.f_rec))
        new_hi = torch.where(high, a_j, torch.where(flip, z.lo, z.hi))
        new_f_hi = torch.where(high, f_j, torch.where(flip, z.f_lo, z.f_hi))
        z.lo, z.f_lo, z.d_lo = (
            torch.where(move, a_j, z.lo),
            torch.where(move, f_j, z.f_lo),
            torch.where(move, d_j, z.d_lo),
        )
        z.rec, z.f_rec, z.hi, z.f_hi = new_rec, new_f_rec, new_hi, new_f_hi
        z.i = z.i + zooming.long()
        zooming = zooming & ~accept & (z.i <= maxiter)
    return SearchResult(best, best_f, ok)
