"""Closed-form ridge heads for batches of probes: penalties scaled to the features, the exact
leave-one-out error of ridge with an unpenalised intercept (e_i / (1 - H_ii), as scikit-learn's
RidgeCV), and the solve. Arrays carry a leading probe axis; features and targets are centred
over prompts (the intercept's share of the hat matrix is 1/N)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def ridge_penalties(fc: Tensor, alphas: Sequence[float]) -> Tensor:
    """(k, A) absolute penalties: `alphas` times the mean eigenvalue of Fc^T Fc, per probe."""
    scale = fc.pow(2).sum((1, 2)) / fc.shape[-1]
    return scale.clamp_min(1e-300).unsqueeze(-1) * torch.tensor(alphas, dtype=fc.dtype, device=fc.device)


def ridge_loo(fc: Tensor, yc: Tensor, penalties: Tensor) -> Tensor:
    """(k, A) leave-one-out mean squared error of ridge with an unpenalised intercept, for each
    penalty; fc (k, N, F) and yc (k, N, d) centred over N. Exact: e_i / (1 - 1/N - H_ii)."""
    n, width = fc.shape[1], fc.shape[2]
    if width <= n:  # eigenvectors of the smaller Gram matrix
        evals, vecs = torch.linalg.eigh(fc.transpose(1, 2) @ fc)
        q = fc @ vecs  # (k, N, F): Fc V, columns of squared norm evals
    else:
        evals, vecs = torch.linalg.eigh(fc @ fc.transpose(1, 2))
        q = vecs * evals.clamp_min(0).sqrt().unsqueeze(1)
    evals = evals.clamp_min(0)
    proj = q.transpose(1, 2) @ yc  # (k, F, d)
    shrink = 1 / (evals.unsqueeze(1) + penalties.unsqueeze(-1))  # (k, A, F)
    fitted = q.unsqueeze(1) @ (shrink.unsqueeze(-1) * proj.unsqueeze(1))  # (k, A, N, d)
    leverage = (q.pow(2) @ shrink.transpose(1, 2)).transpose(1, 2) + 1 / n  # (k, A, N)
    resid = (yc.unsqueeze(1) - fitted) / (1 - leverage).clamp_min(1e-12).unsqueeze(-1)
    return resid.pow(2).mean((2, 3))


def loo_diagonal(fc: Tensor, yc: Tensor, gram: Tensor, penalty: Tensor) -> Tensor:
    """Leave-one-out MSE (G,) of ridge with a diagonal penalty (G, F), by a Cholesky factor instead of
    an eigendecomposition: with L L^T = Fc^T Fc + diag(penalty) (`gram` = Fc^T Fc) and Q = L^-1 Fc^T,
    H_ii = |Q_i|^2 + 1/N and the fit is Q^T Q Yc."""
    chol = torch.linalg.cholesky(gram + torch.diag_embed(penalty))
    q = torch.linalg.solve_triangular(chol, fc.transpose(1, 2), upper=False)  # (G, F, N)
    leverage = q.pow(2).sum(1) + 1 / fc.shape[1]  # (G, N)
    resid = (yc - q.transpose(1, 2) @ (q @ yc)) / (1 - leverage).clamp_min(1e-12).unsqueeze(-1)
    return resid.pow(2).mean((1, 2))


def ridge_head(fc: Tensor, yc: Tensor, penalty: Tensor) -> Tensor:
    """(k, F, d): W = (Fc^T Fc + penalty I)^-1 Fc^T Yc, per probe."""
    gram = fc.transpose(1, 2) @ fc
    gram.diagonal(dim1=1, dim2=2).add_(penalty.unsqueeze(-1))
    chol, info = torch.linalg.cholesky_ex(gram)
    if bool((info == 0).all()):
        return torch.cholesky_solve(fc.transpose(1, 2) @ yc, chol)
    return torch.linalg.lstsq(gram, fc.transpose(1, 2) @ yc).solution  # singular at penalty 0: least squares


def choose_penalty(fc: Tensor, yc: Tensor, penalties: Tensor) -> tuple[Tensor, Tensor]:
    """Per probe: the index (into penalties (k, A)) with the least leave-one-out error, and that error."""
    loo = ridge_loo(fc, yc, penalties)
    best = loo.argmin(-1)
    return best, loo.gather(1, best.unsqueeze(1)).squeeze(1)
