"""Batched full-batch L-BFGS, and modified Newton (`newton_minimize`), for many independent smooth
problems at once (the probes' fitters).

Each element b of the batch minimises its own f_b(x_b), x_b in R^n. An iteration takes, for every
element still running, the L-BFGS direction (Nocedal & Wright Alg. 7.4, H_0 = (s.y / y.y) I from
the newest pair, `memory` pairs: with memory >= n this is close to BFGS with its initial matrix
rescaled at every iteration) and a step satisfying the strong Wolfe conditions from the
project's Moré-Thuente search (probe/learners/line_search.py, scipy's `dcsrch`; c1 = 1e-4,
c2 = 0.9), first trial 1 / |p| at the first iteration and 1 after, as scipy's L-BFGS-B.

Stopping rule, per element (scipy's L-BFGS-B `pgtol` and `factr` tests): converged when
|grad f|_inf <= gtol, or when an iteration lowered f by at most ftol * max(|f|, 1).
An element whose line search fails is stopped where it is and counts as converged only if its
gradient already passed the gradient test. Elements that finish leave the working set, so the
cost follows the elements still running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.threads import per_matrix
from ..learners.line_search import more_thuente

Objective = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (x (k, n), index (k,)) -> (f (k,), grad (k, n))
EPS = torch.finfo(torch.float64).eps


@dataclass
class Minimum:
    """Per element: the last iterate x (B, n), f there, |grad f|_inf there, iterations taken and
    whether the stopping rule (module docstring) was met before `max_iter`."""

    x: Tensor
    value: Tensor
    grad_norm: Tensor
    iterations: Tensor
    converged: Tensor


def minimize(
    fun: Objective, x0: Tensor, *, gtol: float | Tensor, ftol: float, max_iter: int, memory: int = 10
) -> Minimum:
    """Minimise every element's objective from x0 (B, n); see the module docstring. `gtol` may be
    one per element (B,)."""
    x = x0.clone()
    batch = x.shape[0]
    gtol = torch.as_tensor(gtol, dtype=x.dtype, device=x.device).expand(batch)
    every = torch.arange(batch, device=x.device)
    f, g = fun(x, every)
    iterations = torch.zeros(batch, dtype=torch.long, device=x.device)
    converged = g.abs().amax(-1) <= gtol
    # the pairs of every element, oldest first: s, y (B, m, n), rho (B, m), rho = 0 when skipped
    s_pairs, y_pairs, rho_pairs = (
        x.new_zeros(batch, 0, x.shape[1]),
        x.new_zeros(batch, 0, x.shape[1]),
        x.new_zeros(batch, 0),
    )
    gamma = torch.ones_like(f)
    active = (~converged).nonzero().squeeze(-1)
    for k in range(max_iter):
        if active.numel() == 0:
            break
        p = -lbfgs_direction(g[active], s_pairs[active], y_pairs[active], rho_pairs[active], gamma[active])
        slope = (g[active] * p).sum(-1)
        p = torch.where((slope < 0).unsqueeze(-1), p, -g[active])  # not a descent direction: steepest descent
        slope = (g[active] * p).sum(-1)
        x_a, step0 = x[active], torch.ones_like(slope)
        if k == 0:
            step0 = (1 / p.norm(dim=-1).clamp_min(1e-300)).clamp(max=1e10)

        last_f, last_g = f[active].clone(), g[active].clone()  # the search's last evaluation per element

        def phi(steps: Tensor, index: Tensor, x_a=x_a, p=p, active=active, last_f=last_f, last_g=last_g):
            value, grad = fun(x_a[index] + steps.unsqueeze(-1) * p[index], active[index])
            last_f[index], last_g[index] = value, grad
            return value, (grad * p[index]).sum(-1)

        res = more_thuente(phi, f[active], slope, step0, ftol=1e-4, gtol=0.9, xtol=1e-14, stpmin=0.0, stpmax=1e10)
        step = torch.where(res.ok.unsqueeze(-1), res.step.unsqueeze(-1) * p, torch.zeros_like(p))
        x_new = x_a + step
        # a search ends right after evaluating the step it accepts, so its last evaluation is the new
        # point; a failed search keeps the old point (and its value and gradient)
        f_new = torch.where(res.ok, last_f, f[active])
        g_new = torch.where(res.ok.unsqueeze(-1), last_g, g[active])
        y_vec = g_new - g[active]
        ys = (y_vec * step).sum(-1)
        keep = res.ok & (ys > EPS * -slope * res.step)
        rho = torch.where(keep, 1 / torch.where(keep, ys, 1.0), torch.zeros_like(ys))
        s_full, y_full, rho_full = (torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(f))
        s_full[active], y_full[active], rho_full[active] = step, y_vec, rho
        s_pairs = torch.cat([s_pairs, s_full.unsqueeze(1)], 1)[:, -memory:]
        y_pairs = torch.cat([y_pairs, y_full.unsqueeze(1)], 1)[:, -memory:]
        rho_pairs = torch.cat([rho_pairs, rho_full.unsqueeze(1)], 1)[:, -memory:]
        gamma[active] = torch.where(keep, ys / torch.where(keep, (y_vec * y_vec).sum(-1), 1.0), gamma[active])
        decrease = f[active] - f_new
        x[active], f[active], g[active] = x_new, f_new, g_new
        iterations[active] += 1
        small_grad = g_new.abs().amax(-1) <= gtol[active]
        stalled = res.ok & (decrease <= ftol * torch.maximum(f_new.abs(), torch.ones_like(f_new)))
        converged[active] = small_grad | stalled
        stop = converged[active] | ~res.ok
        active = active[~stop]
    return Minimum(x, f, g.abs().amax(-1), iterations, converged)


def lbfgs_direction(g: Tensor, s: Tensor, y: Tensor, rho: Tensor, gamma: Tensor) -> Tensor:
    """H g of L-BFGS (Nocedal & Wright Alg. 7.4, H_0 = gamma I) for pairs stacked oldest first: s, y
    (k, m, n), rho (k, m), 0 for a skipped pair. The algorithm's two loops are the forward
    substitutions of two unit triangular systems in the pairs' inner products s_i . y_j, so they are
    solved as such, all pairs at once: a = rho (S g - U a) with U_ij = s_i . y_j for j > i (the first
    loop, newest pair first), q = g - Y^T a, and c = a - rho (Y gamma q + L c) with L_ij = y_i . s_j for
    j < i (the second loop, oldest first); H g = gamma q + S^T c."""
    r0_scale = gamma.unsqueeze(-1)
    if s.shape[1] == 0:
        return r0_scale * g
    eye = torch.eye(s.shape[1], dtype=s.dtype, device=s.device)
    sy = s @ y.transpose(1, 2)  # (k, m, m): s_i . y_j
    weight = rho.unsqueeze(-1)
    upper = eye + weight * sy.triu(1)
    a = torch.linalg.solve_triangular(upper, weight * (s @ g.unsqueeze(-1)), upper=True)  # (k, m, 1)
    r0 = r0_scale * (g - (y.transpose(1, 2) @ a).squeeze(-1))
    lower = eye + weight * sy.transpose(1, 2).tril(-1)
    c = torch.linalg.solve_triangular(lower, a - weight * (y @ r0.unsqueeze(-1)), upper=False)
    return r0 + (s.transpose(1, 2) @ c).squeeze(-1)


HessianObjective = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]  # -> (f (k,), grad (k, n), hess (k, n, n))
EIG_FLOOR = 1e-8  # modified Newton: |eigenvalue| floored at this fraction of the largest
MAX_STEP = 10.0  # modified Newton: largest first trial step, infinity norm
HALVINGS = 40  # modified Newton: most step halvings of one search


def newton_minimize(
    fun: Objective, hess: HessianObjective, x0: Tensor, *, gtol: float | Tensor, ftol: float, max_iter: int
) -> Minimum:
    """Modified Newton for every element of the batch from x0 (B, n) (Nocedal & Wright Sec. 3.4):
    the direction -V diag(1 / max(|e|, EIG_FLOOR max|e|)) V^T g from the eigendecomposition of the
    Hessian (negative curvature turned, flat directions bounded), shortened to an infinity norm of
    at most MAX_STEP, then Armijo backtracking from a unit step (no curvature condition: nothing is
    updated from the step) and the same stopping rule as `minimize`. `fun` gives f at the search's
    trial points, `hess` (f, grad, Hessian) once per iteration at the accepted one."""
    x = x0.clone()
    batch = x.shape[0]
    gtol = torch.as_tensor(gtol, dtype=x.dtype, device=x.device).expand(batch)
    every = torch.arange(batch, device=x.device)
    f, g, h = hess(x, every)
    iterations = torch.zeros(batch, dtype=torch.long, device=x.device)
    converged = g.abs().amax(-1) <= gtol
    active = (~converged).nonzero().squeeze(-1)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        evals, vecs = per_matrix(torch.linalg.eigh, h[active])
        size = evals.abs()
        size = size.clamp_min(EIG_FLOOR * size.amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny))
        p = -(vecs @ ((vecs.transpose(1, 2) @ g[active].unsqueeze(-1)) / size.unsqueeze(-1))).squeeze(-1)
        p = p * (MAX_STEP / p.abs().amax(-1).clamp_min(MAX_STEP)).unsqueeze(-1)
        slope = (g[active] * p).sum(-1)
        x_a = x[active]
        step, ok = _backtrack(fun, x_a, p, f[active], slope, active)
        x_new = x_a + step.unsqueeze(-1) * p
        f_new, g_new, h_new = hess(x_new, active)
        decrease = f[active] - f_new
        x[active], f[active], g[active], h[active] = x_new, f_new, g_new, h_new
        iterations[active] += 1
        small_grad = g_new.abs().amax(-1) <= gtol[active]
        stalled = ok & (decrease <= ftol * torch.maximum(f_new.abs(), torch.ones_like(f_new)))
        converged[active] = small_grad | stalled
        active = active[~(converged[active] | ~ok)]
    return Minimum(x, f, g.abs().amax(-1), iterations, converged)


def _backtrack(fun: Objective, x: Tensor, p: Tensor, f: Tensor, slope: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Armijo backtracking (Nocedal & Wright Alg. 3.1, c = 1e-4, halving from a unit step) for every
    element at once: (steps, found); an element without a step after HALVINGS halvings gets 0."""
    step, found = torch.ones_like(f), torch.zeros_like(f, dtype=torch.bool)
    todo = torch.arange(len(f), device=f.device)
    for _ in range(HALVINGS):
        if todo.numel() == 0:
            break
        value, _ = fun(x[todo] + step[todo].unsqueeze(-1) * p[todo], index[todo])
        good = value <= f[todo] + 1e-4 * step[todo] * slope[todo]
        found[todo[good]] = True
        step[todo[~good]] *= 0.5
        todo = todo[~good]
    return torch.where(found, step, torch.zeros_like(step)), found
