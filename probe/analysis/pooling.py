"""Attention pooling of the probes by variable projection (probe/analysis/probes.py's module
docstring): `ProbeSet` (G probes on by-position states: the ridge objective of the pooling scores
with the head eliminated, its gradient and its Hessian), `fit_pooling` (the penalty rounds) and the
per-round fit, L-BFGS then modified Newton where that pays (`newton_pays`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.threads import per_matrix
from .lbfgs import Minimum, minimize, newton_minimize
from .ridge import cholesky_solve, choose_penalty, lower_solve, ridge_head, ridge_loo, ridge_penalties

MEMORY = 80  # L-BFGS pairs: at least P for most prefixes; measured 1.6x faster than 20 on the default
FIRST_ROUND_PENALTY = 1e-3  # the first round's largest penalty (fraction of the mean eigenvalue)
FIRST_ROUND_SLACK = 100.0  # a capped first round only finds the basin: gtol x this
MIN_GAIN = 1e-3  # leave-one-out R^2 that another penalty, a larger hidden scale or uniform pooling must add
NEWTON_AFTER = 15  # L-BFGS iterations before the probes still running switch to Newton (10-20 measured; 15 fastest)
# a probe switches to Newton only where its Hessian costs at most NEWTON_RATIO gradient evaluations
# (the default checkpoint's shape: <= 3.4 at P <= 30, D = 64, d = 4, at any prompt count) or at most
# NEWTON_FLOPS (planted models: D 9-36, overhead-bound); measured not to pay at Garg's standard shape
# (P = 80, D = 256, d = 20: 13 gradients, 1.4e9; probe stage 64 s with Newton, 53 s without)
NEWTON_RATIO = 4.0
NEWTON_FLOPS = 5e7
MAX_ROUNDS = 5  # penalty re-chosen at the optimum pooling at most this many times


Groups = list[tuple[Tensor | slice, int, int]]  # (rows, layer, positions used) per layer: ProbeSet.groups
OBJECTIVE_BLOCK_BYTES = 64 << 20  # pooled states, centred, and their gradient for one block of layers' probes


def layer_blocks(groups: Groups, per_block: int) -> list[tuple[slice, Groups]]:
    """`groups` (rows as consecutive slices, layer by layer) cut into blocks of whole layers of
    about `per_block` probes (at least one layer each): (rows of the block, its groups with rows
    counted from the block's first). Groups whose rows are not slices stay one block."""
    if not all(isinstance(rows, slice) for rows, _, _ in groups):
        return [(slice(None), groups)]
    blocks: list[tuple[slice, Groups]] = []
    start = 0
    current: Groups = []
    for rows, layer, used in groups:
        assert isinstance(rows, slice)
        if current and rows.stop - start > per_block:
            blocks.append((slice(start, rows.start), current))
            start, current = rows.start, []
        current.append((slice(rows.start - start, rows.stop - start), layer, used))
    last = groups[-1][0] if groups else slice(0, 0)
    assert isinstance(last, slice)
    blocks.append((slice(start, last.stop), current))
    return blocks


@dataclass
class ProbeSet:
    """G probes on by-position states (L, P, N, D): each reads layer `layer[g]` at its first
    `n_pos[g]` positions and regresses the centred targets yc[g] (N, d).

    The states are held centred over the prompts, position by position, with their means kept
    (`means`, (L, P, D) float64): pooling is linear, mean_N(sum_p alpha_p h_p) = sum_p alpha_p
    mean_N(h_p), so pooling centred states gives the centred Zc the objective needs without centring
    Z at every evaluation. Built from raw states (`means` None) the set centres a copy;
    `centred_in_place` centres the caller's tensor instead. `pooled_blocks` adds the means back."""

    states: Tensor
    layer: Tensor  # (G,) long
    n_pos: Tensor  # (G,) long
    yc: Tensor  # (G, N, d) float64
    means: Tensor | None = None  # (L, P, D): the states' means over prompts (None: `states` are raw)

    def __post_init__(self) -> None:
        if self.means is None:
            self.states, self.means = _centred(self.states.clone())

    @classmethod
    def centred_in_place(cls, states: Tensor, layer: Tensor, n_pos: Tensor, yc: Tensor) -> ProbeSet:
        """The probes on `states` centred in place (the caller's tensor: it holds centred states after)."""
        states, means = _centred(states)
        return cls(states, layer, n_pos, yc, means)

    @property
    def mask(self) -> Tensor:
        return torch.arange(self.states.shape[1], device=self.n_pos.device).view(1, -1) < self.n_pos.view(-1, 1)

    def take(self, index: Tensor) -> ProbeSet:
        """The probes `index` (sharing the states)."""
        return ProbeSet(self.states, self.layer[index], self.n_pos[index], self.yc[index], self.means)

    def attention(self, scores: Tensor, index: Tensor) -> Tensor:
        """alpha (k, P) of the probes `index`: softmax over each probe's own positions."""
        return torch.softmax(scores.masked_fill(~self.mask[index], -math.inf), dim=-1)

    def groups(self, index: Tensor) -> Groups:
        """(rows of `index`, layer, positions used) for each layer present: its probes pool over the
        most positions any of them reads (alpha is exactly 0 beyond a probe's own), one matmul a layer.
        Rows are a slice where `index` lists its probes layer by layer (as the grid and every subset of
        it do), so that the matmul writes its rows in place."""
        layers = self.layer[index]
        values, counts = torch.unique_consecutive(layers, return_counts=True)
        out: Groups = []
        if len(values) == len(values.unique()):
            start = 0
            for layer, count in zip(values.tolist(), counts.tolist()):
                rows = slice(start, start + count)
                out.append((rows, layer, int(self.n_pos[index[rows]].max())))
                start += count
            return out
        for layer in values.unique().tolist():
            where = (layers == layer).nonzero().squeeze(-1)
            out.append((where, layer, int(self.n_pos[index[where]].max())))
        return out

    def pool(self, alpha: Tensor, index: Tensor, states: Tensor | None = None, groups: Groups | None = None) -> Tensor:
        """z (k, N, D) = sum_p alpha_p h_p for the probes `index` (one matmul per layer), on the
        set's own centred states (so centred) or on `states`."""
        states = self.states if states is None else states
        _, _, n, width = states.shape
        z = torch.empty(len(index), n, width, dtype=torch.float64, device=states.device)
        for rows, layer, used in self.groups(index) if groups is None else groups:
            flat = states[layer, :used].reshape(used, -1)
            weights = alpha[rows, :used].to(flat.dtype)
            if isinstance(rows, slice) and flat.dtype == torch.float64:
                torch.mm(weights, flat, out=z[rows].view(len(weights), -1))
            else:
                z[rows] = (weights @ flat).view(len(weights), n, width).double()
        return z

    def pool_grad(self, dz: Tensor, index: Tensor, groups: Groups | None = None) -> Tensor:
        """(k, P): d f / d alpha_p = <h_p, d f / d z> for the probes `index`."""
        out = torch.zeros(len(index), self.states.shape[1], dtype=torch.float64, device=dz.device)
        for rows, layer, used in self.groups(index) if groups is None else groups:
            flat = self.states[layer, :used].reshape(used, -1)
            grad = dz[rows]
            out[rows, :used] = (grad.reshape(len(grad), -1).to(flat.dtype) @ flat.T).double()
        return out

    def per_block(self, max_bytes: int | None = None) -> int:
        """Probes per block of `layer_blocks` whose pooled states, centred, and gradient take about
        `max_bytes` (default OBJECTIVE_BLOCK_BYTES)."""
        _, _, n, width = self.states.shape
        return max(1, (max_bytes or OBJECTIVE_BLOCK_BYTES) // (3 * 8 * n * width))

    def objective(self, penalty: Tensor, max_bytes: int | None = None):
        """f(s) and its gradient for `minimize`: the ridge objective at the optimal head (module
        docstring), for blocks of whole layers' probes at a time (at most about `max_bytes` of pooled
        states and their gradients): each layer's pooling is the same one matmul as unblocked, and
        every other product is per probe, so the numbers do not depend on the blocks (tested)."""

        def fun(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
            groups = self.groups(index)
            blocks = layer_blocks(groups, self.per_block(max_bytes))
            if len(blocks) == 1:
                return self._objective_block(scores, index, penalty, groups)
            f, grad = torch.empty(len(index), dtype=torch.float64, device=scores.device), torch.empty_like(scores)
            for rows, local in blocks:
                f[rows], grad[rows] = self._objective_block(scores[rows], index[rows], penalty, local)
            return f, grad

        return fun

    def _objective_block(self, scores: Tensor, index: Tensor, penalty: Tensor, groups: Groups):
        alpha = self.attention(scores, index)
        zc, yc = self.pool(alpha, index, groups=groups), self.yc[index]  # centred states: Zc
        w = ridge_head(zc, yc, penalty[index])
        resid = yc - zc @ w
        del zc
        scale = resid.shape[1] * resid.shape[2]
        f = (resid.pow(2).sum((1, 2)) + penalty[index] * w.pow(2).sum((1, 2))) / scale
        grad_alpha = self.pool_grad(-2 / scale * resid @ w.transpose(1, 2), index, groups)  # centring drops out
        return f, alpha * (grad_alpha - (alpha * grad_alpha).sum(-1, keepdim=True))

    def hessian(self, penalty: Tensor, max_bytes: int = 64 << 20):
        """f(s), its gradient and its Hessian (k, P, P) for `newton_minimize`, probes in chunks of at
        most `max_bytes` of per-position terms. With W the optimal head, R = Yc - Zc W, A = Zc^T Zc +
        lam I, u_p = Hc_p W and m_p = Hc_p^T R, the gradient in alpha is -2 <m_p, W> / (N d) and,
        differentiating it with dW_q = A^-1 e_q, e_q = m_q - Zc^T u_q (from A W = Zc^T Yc),
        d^2 f / d alpha_p d alpha_q = 2 (<u_p, u_q> - <e_p, A^-1 e_q>) / (N d). Through the softmax,
        with J = diag(alpha) - alpha alpha^T and gamma = grad_s f:
        H_s = J H_alpha J + diag(gamma) - alpha gamma^T - gamma alpha^T."""

        def fun(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            _, n_pos, n, width = self.states.shape
            per_probe = 8 * n_pos * (n + width) * self.yc.shape[-1]
            chunk = max(1, max_bytes // per_probe)
            parts = [
                self._hessian_chunk(scores[lo : lo + chunk], index[lo : lo + chunk], penalty)
                for lo in range(0, len(index), chunk)
            ]
            return tuple(torch.cat(v) for v in zip(*parts))  # type: ignore[return-value]

        return fun

    def _hessian_chunk(self, scores: Tensor, index: Tensor, penalty: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        alpha, groups = self.attention(scores, index), self.groups(index)
        zc, yc, lam = self.pool(alpha, index, groups=groups), self.yc[index], penalty[index]  # centred states: Zc
        gram = zc.transpose(1, 2) @ zc
        gram.diagonal(dim1=1, dim2=2).add_(lam.unsqueeze(-1))
        chol = per_matrix(torch.linalg.cholesky, gram)
        w = per_matrix(cholesky_solve, chol, zc.transpose(1, 2) @ yc)
        resid = yc - zc @ w
        k, n, d = resid.shape
        width, n_pos, scale = zc.shape[-1], alpha.shape[1], n * d
        f = (resid.pow(2).sum((1, 2)) + lam * w.pow(2).sum((1, 2))) / scale
        u = torch.zeros(k, n_pos, n, d, dtype=torch.float64, device=zc.device)
        m = torch.zeros(k, n_pos, width, d, dtype=torch.float64, device=zc.device)
        for rows, layer, used in groups:
            states = self.states[layer, :used].double()  # (used, N, D)
            w_rows, r_rows = w[rows], resid[rows]
            count = len(w_rows)
            hw = (states.reshape(used * n, width) @ w_rows.permute(1, 0, 2).reshape(width, count * d)).view(
                used, n, count, d
            )
            u[rows, :used] = hw.permute(2, 0, 1, 3)  # centred states: Hc_p W
            hr = (states.transpose(1, 2) @ r_rows.permute(1, 0, 2).reshape(n, count * d)).view(used, width, count, d)
            m[rows, :used] = hr.permute(2, 0, 1, 3)
        grad_alpha = -2 / scale * (m * w.unsqueeze(1)).sum((2, 3))
        zu = (zc.transpose(1, 2) @ u.permute(0, 2, 1, 3).reshape(k, n, n_pos * d)).view(k, width, n_pos, d)
        e = m.permute(0, 2, 1, 3) - zu  # (k, D, P, d)
        fe = per_matrix(lower_solve, chol, e.reshape(k, width, n_pos * d)).view(k, width, n_pos, d)
        flat_u, flat_e = u.reshape(k, n_pos, n * d), fe.permute(0, 2, 1, 3).reshape(k, n_pos, width * d)
        hess_alpha = 2 / scale * (flat_u @ flat_u.transpose(1, 2) - flat_e @ flat_e.transpose(1, 2))
        gamma = alpha * (grad_alpha - (alpha * grad_alpha).sum(-1, keepdim=True))
        jac = torch.diag_embed(alpha) - alpha.unsqueeze(2) * alpha.unsqueeze(1)
        outer = alpha.unsqueeze(2) * gamma.unsqueeze(1)
        hess = jac @ hess_alpha @ jac + torch.diag_embed(gamma) - outer - outer.transpose(1, 2)
        return f, gamma, hess

    def centred_blocks(self, scores: Tensor, max_bytes: int | None = None) -> Iterator[tuple[slice, Tensor]]:
        """(rows, Zc (k, N, D) of those probes at `scores`) for blocks of whole layers' probes (at most
        about `max_bytes` of pooled states and their temporaries): every probe's pooled, centred
        states a block at a time, each layer's pooling the same one matmul as for all at once."""
        every = torch.arange(len(self.layer), device=self.layer.device)
        for rows, groups in layer_blocks(self.groups(every), self.per_block(max_bytes)):
            yield rows, self.pool(self.attention(scores[rows], every[rows]), every[rows], groups=groups)

    def pooled_blocks(
        self, alpha_of: Callable[[slice], Tensor], max_bytes: int | None = None
    ) -> Iterator[tuple[slice, Tensor]]:
        """(rows, z (k, N, D)) for blocks of whole layers' probes, pooled with the weights
        `alpha_of(rows)` (k, P): `pool` a block at a time (about `max_bytes` of pooled states and
        their temporaries a block), each layer's pooling the same one matmul as for all at once,
        and the pooled means sum_p alpha_p mean_N(h_p) added back (z as pooled from the raw states)."""
        assert self.means is not None
        every = torch.arange(len(self.layer), device=self.layer.device)
        for rows, groups in layer_blocks(self.groups(every), self.per_block(max_bytes)):
            alpha = alpha_of(rows)
            z = self.pool(alpha, every[rows], groups=groups)
            for local, layer, used in groups:
                z[local] += (alpha[local, :used] @ self.means[layer, :used]).unsqueeze(1)
            yield rows, z


def _centred(states: Tensor) -> tuple[Tensor, Tensor]:
    """`states` (L, P, N, D) centred over prompts in place, and their means (L, P, D) in float64."""
    means = states.mean(2, keepdim=True, dtype=torch.float64)
    states.sub_(means.to(states.dtype))
    return states, means.squeeze(2)


@dataclass
class PoolingFit:
    """Per probe (G,): pooling scores (G, P), penalty, leave-one-out MSE, L-BFGS iterations (all
    rounds), final |grad_s f|_inf, whether the stopping rule was met, and the penalty chosen by
    leave-one-out at uniform pooling with its error (`uniform_penalty`, `uniform_loo`: what a head
    on uniform pooling chooses, so the MLP probe's uniform alternative does not choose again)."""

    scores: Tensor
    penalty: Tensor
    loo: Tensor
    iterations: Tensor
    grad_norm: Tensor
    converged: Tensor
    uniform_penalty: Tensor
    uniform_loo: Tensor

    def to(self, device: str) -> PoolingFit:
        return PoolingFit(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))

    def take(self, index: Tensor) -> PoolingFit:
        """The fits of the probes `index`."""
        return PoolingFit(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def fit_pooling(
    probes: ProbeSet, alphas: Sequence[float], learned: bool, gtol: float, ftol: float, max_iter: int
) -> PoolingFit:
    """The linear probes' pooling (module docstring); `learned` False keeps uniform pooling. The
    penalties' grid is fixed per probe at uniform pooling, so that rounds choose among the same values."""
    n_probes, n_pos = len(probes.layer), probes.states.shape[1]
    device = probes.layer.device
    scores = torch.zeros(n_probes, n_pos, dtype=torch.float64, device=device)
    grid = torch.empty(n_probes, len(alphas), dtype=torch.float64, device=device)  # (G, A)
    choice, loo = torch.empty(n_probes, dtype=torch.long, device=device), torch.empty_like(scores[:, 0])
    # a heavy penalty flattens f(s) around uniform pooling and can hold it in a poor basin: the first
    # round pools with at most FIRST_ROUND_PENALTY, to a loose tolerance where that is not the choice
    cap = torch.empty_like(choice)
    for rows, zc in probes.centred_blocks(scores):  # each probe's numbers are its own
        grid[rows] = ridge_penalties(zc, alphas)
        choice[rows], loo[rows] = choose_penalty(zc, probes.yc[rows], grid[rows])
        cap[rows] = (ridge_penalties(zc, (FIRST_ROUND_PENALTY,)) >= grid[rows]).sum(1).clamp(1, grid.shape[1]) - 1
    uniform_penalty, uniform_loo = grid.gather(1, choice.unsqueeze(1)).squeeze(1), loo.clone()
    capped = learned & (choice > cap)
    choice = torch.where(capped, cap, choice)
    iterations = torch.zeros(n_probes, dtype=torch.long, device=device)
    grad_norm = torch.zeros(n_probes, dtype=torch.float64, device=device)
    converged = torch.ones(n_probes, dtype=torch.bool, device=device)
    todo = torch.full((n_probes,), learned, dtype=torch.bool, device=device)
    for rnd in range(MAX_ROUNDS):
        if not bool(todo.any()):
            break
        index = todo.nonzero().squeeze(-1)
        sub = probes.take(index)
        penalty = grid[index].gather(1, choice[index].unsqueeze(1)).squeeze(1)
        loose = capped[index] if rnd == 0 else torch.zeros_like(capped[index])
        tol = gtol * torch.where(loose, FIRST_ROUND_SLACK, 1.0).double()
        res = _minimize(sub, penalty, scores[index], tol, ftol, max_iter)
        scores[index], iterations[index] = res.x, iterations[index] + res.iterations
        grad_norm[index], converged[index] = res.grad_norm, res.converged
        every_loo = torch.cat(
            [ridge_loo(zc, sub.yc[rows], grid[index][rows]) for rows, zc in sub.centred_blocks(res.x)]
        )  # (k, A)
        best = every_loo.argmin(1)
        current = every_loo.gather(1, choice[index].unsqueeze(1)).squeeze(1)
        # move the penalty only for a leave-one-out gain above MIN_GAIN (in R^2): where nothing is
        # decoded the choice is a near-tie that would otherwise cycle between rounds
        gain = current - every_loo.gather(1, best.unsqueeze(1)).squeeze(1)
        moved = loose | (gain > MIN_GAIN * sub.yc.pow(2).mean((1, 2)))
        new_choice = torch.where(moved, best, choice[index])
        loo[index] = every_loo.gather(1, new_choice.unsqueeze(1)).squeeze(1)
        todo[:] = False
        todo[index[(new_choice != choice[index]) | loose]] = True
        choice[index] = new_choice
    converged &= ~todo  # the penalty still moving after the last round
    penalty = grid.gather(1, choice.unsqueeze(1)).squeeze(1)
    return PoolingFit(scores, penalty, loo, iterations, grad_norm, converged, uniform_penalty, uniform_loo)


def hessian_flops(n_pos: Tensor, n_prompts: int, width: int, n_targets: int) -> Tensor:
    """Flops of one probe's Hessian beyond its gradient (`ProbeSet.hessian`): H_p W, H_p^T R and
    Zc^T u_p for every position (3 P N D d multiply-adds) and the P x P Gram of the u_p (P^2 N d)."""
    return 2 * (3 * n_pos * n_prompts * width * n_targets + n_pos**2 * n_prompts * n_targets)


def gradient_flops(n_pos: Tensor, n_prompts: int, width: int) -> Tensor:
    """Flops of one evaluation of a probe's objective and gradient: the pooling and its gradient
    (2 P N D multiply-adds) and the Gram matrix Zc^T Zc (N D^2)."""
    return 2 * n_prompts * width * (2 * n_pos + width)


def newton_pays(n_pos: Tensor, n_prompts: int, width: int, n_targets: int) -> Tensor:
    """Per probe: whether the Newton stage is worth its Hessian: it costs at most NEWTON_RATIO
    gradient evaluations, or at most NEWTON_FLOPS (where per-call overhead, not arithmetic, sets
    the time)."""
    hessian = hessian_flops(n_pos, n_prompts, width, n_targets)
    return (hessian <= NEWTON_RATIO * gradient_flops(n_pos, n_prompts, width)) | (hessian <= NEWTON_FLOPS)


def _minimize(probes: ProbeSet, penalty: Tensor, scores: Tensor, gtol: Tensor, ftol: float, max_iter: int):
    """The pooling fit of one round (module docstring): probes where Newton pays (`newton_pays`)
    take L-BFGS for NEWTON_AFTER iterations, then modified Newton while still running (iterations
    counted together); the others L-BFGS throughout."""
    _, _, n_prompts, width = probes.states.shape
    newton = newton_pays(probes.n_pos, n_prompts, width, probes.yc.shape[-1])
    if not bool(newton.all()):
        out = Minimum(scores.clone(), torch.empty_like(gtol), torch.empty_like(gtol), newton.long(), newton.clone())
        for part, after in ((newton, NEWTON_AFTER), (~newton, max_iter)):
            index = part.nonzero().squeeze(-1)
            if index.numel():
                res = _minimize_part(
                    probes.take(index), penalty[index], scores[index], gtol[index], ftol, max_iter, after
                )
                for field in ("x", "value", "grad_norm", "iterations", "converged"):
                    getattr(out, field)[index] = getattr(res, field)
        return out
    return _minimize_part(probes, penalty, scores, gtol, ftol, max_iter, NEWTON_AFTER)


def _minimize_part(
    probes: ProbeSet, penalty: Tensor, scores: Tensor, gtol: Tensor, ftol: float, max_iter: int, after: int
) -> Minimum:
    """L-BFGS for at most `after` iterations, then modified Newton for the probes still running."""
    fun = probes.objective(penalty)
    first = minimize(fun, scores, gtol=gtol, ftol=ftol, max_iter=min(max_iter, after), memory=MEMORY)
    rest = (~first.converged).nonzero().squeeze(-1)
    if rest.numel() == 0 or max_iter <= after:
        return first
    sub = probes.take(rest)
    second = newton_minimize(
        sub.objective(penalty[rest]),
        sub.hessian(penalty[rest]),
        first.x[rest],
        gtol=gtol[rest],
        ftol=ftol,
        max_iter=max_iter - after,
    )
    first.x[rest], first.value[rest], first.grad_norm[rest] = second.x, second.value, second.grad_norm
    first.iterations[rest] += second.iterations
    first.converged[rest] = second.converged
    return first
