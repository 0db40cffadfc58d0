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
    k, n_pen, d = len(fc), penalties.shape[1], yc.shape[-1]
    coef = (shrink.unsqueeze(-1) * proj.unsqueeze(1)).permute(0, 2, 1, 3).reshape(k, -1, n_pen * d)  # (k, F, A d)
    fitted = (q @ coef).view(k, n, n_pen, d).transpose(1, 2)  # (k, A, N, d), one matmul per probe
    leverage = (q.pow(2) @ shrink.transpose(1, 2)).transpose(1, 2) + 1 / n  # (k, A, N)
    resid = (yc.unsqueeze(1) - fitted) / (1 - leverage).clamp_min(1e-12).unsqueeze(-1)
    return resid.pow(2).mean((2, 3))


def loo_two_blocks(zc: Tensor, hc: Tensor, yc: Tensor, penalty: Tensor, hidden_penalties: Tensor) -> Tensor:
    """Leave-one-out MSE (G, S) of ridge on the features [Zc, Hc] with penalty (G,) on the Zc block and
    each column of hidden_penalties (G, S) on the Hc block. Block Cholesky of the penalised Gram
    matrix, L = [[L11, 0], [L21, L22]]: L11 and L21 (L11 L21^T = Zc^T Hc) do not depend on the hidden
    penalty, so only the H x H factor L22 is redone per column. With Q = L^-1 [Zc, Hc]^T,
    H_ii = |Q_i|^2 + 1/N and the fit is Q^T Q Yc (as `ridge_loo`)."""
    n = zc.shape[1]
    gram = zc.transpose(1, 2) @ zc
    gram.diagonal(dim1=1, dim2=2).add_(penalty.unsqueeze(-1))
    l11 = torch.linalg.cholesky(gram)
    q1 = torch.linalg.solve_triangular(l11, zc.transpose(1, 2), upper=False)  # (G, D, N)
    l21t = torch.linalg.solve_triangular(l11, zc.transpose(1, 2) @ hc, upper=False)  # (G, D, H)
    rest = hc.transpose(1, 2) - l21t.transpose(1, 2) @ q1  # (G, H, N): Hc^T - L21 Q1
    schur = hc.transpose(1, 2) @ hc - l21t.transpose(1, 2) @ l21t
    leverage = q1.pow(2).sum(1) + 1 / n  # (G, N)
    fitted = q1.transpose(1, 2) @ (q1 @ yc)
    out = []
    for column in hidden_penalties.unbind(1):
        l22 = torch.linalg.cholesky(schur + torch.diag_embed(column.unsqueeze(-1).expand(-1, hc.shape[-1])))
        q2 = torch.linalg.solve_triangular(l22, rest, upper=False)  # (G, H, N)
        resid = (yc - fitted - q2.transpose(1, 2) @ (q2 @ yc)) / (1 - leverage - q2.pow(2).sum(1)).clamp_min(
            1e-12
        ).unsqueeze(-1)
        out.append(resid.pow(2).mean((1, 2)))
    return torch.stack(out, 1)


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
