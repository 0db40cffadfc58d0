"""Closed-form ridge heads for batches of probes: penalties scaled to the features, the exact
leave-one-out error of ridge with an unpenalised intercept (e_i / (1 - H_ii), as scikit-learn's
RidgeCV), and the solve. Arrays carry a leading probe axis; features and targets are centred
over prompts (the intercept's share of the hat matrix is 1/N)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.threads import per_matrix


def lower_solve(lower: Tensor, b: Tensor) -> Tensor:
    """L^-1 b for lower triangular L (batched; for `per_matrix`)."""
    return torch.linalg.solve_triangular(lower, b, upper=False)


def upper_solve(upper: Tensor, b: Tensor) -> Tensor:
    """U^-1 b for upper triangular U (batched; for `per_matrix`)."""
    return torch.linalg.solve_triangular(upper, b, upper=True)


def cholesky_solve(chol: Tensor, b: Tensor) -> Tensor:
    """(L L^T)^-1 b from the lower Cholesky factor L (batched; the factor first, for `per_matrix`)."""
    return torch.cholesky_solve(b, chol)


def ridge_penalties(fc: Tensor, alphas: Sequence[float]) -> Tensor:
    """(k, A) absolute penalties: `alphas` times the mean eigenvalue of Fc^T Fc, per probe."""
    scale = fc.pow(2).sum((1, 2)) / fc.shape[-1]
    return scale.clamp_min(1e-300).unsqueeze(-1) * torch.tensor(alphas, dtype=fc.dtype, device=fc.device)


LOO_BLOCK_BYTES = 64 << 20  # the per-probe temporaries (N x F, A x N x d) of one block of probes


def loo_block(n: int, width: int, n_penalties: int, d: int) -> int:
    """Probes per block of `ridge_loo` within about LOO_BLOCK_BYTES of temporaries."""
    return max(1, LOO_BLOCK_BYTES // (8 * (2 * n * width + width * n_penalties * d + 4 * n_penalties * n * d)))


def ridge_loo(fc: Tensor, yc: Tensor, penalties: Tensor) -> Tensor:
    """(k, A) leave-one-out mean squared error of ridge with an unpenalised intercept, for each
    penalty; fc (k, N, F) and yc (k, N, d) centred over N. Exact: e_i / (1 - 1/N - H_ii). Computed
    a block of probes at a time (at most about LOO_BLOCK_BYTES of temporaries; each probe's error is
    its own, so the blocks give the batched result)."""
    block = loo_block(fc.shape[1], fc.shape[2], penalties.shape[1], yc.shape[-1])
    if block >= len(fc):
        return _ridge_loo(fc, yc, penalties)
    return torch.cat(
        [
            _ridge_loo(fc[lo : lo + block], yc[lo : lo + block], penalties[lo : lo + block])
            for lo in range(0, len(fc), block)
        ]
    )


def _ridge_loo(fc: Tensor, yc: Tensor, penalties: Tensor) -> Tensor:
    """`ridge_loo` for one block of probes."""
    return RidgeBasis(fc).loo(yc, penalties)


class RidgeBasis:
    """Fc (k, N, F), centred, factored once for any number of targets: its Gram matrix Fc^T Fc and
    the eigendecomposition of the smaller of Fc^T Fc and Fc Fc^T. `loo` gives `ridge_loo`'s numbers
    and `head` `ridge_head`'s, for each target, with no new factorisation (bit for bit: the same
    operations on the same factors)."""

    def __init__(self, fc: Tensor):
        n, width = fc.shape[1], fc.shape[2]
        self.fc, self.gram = fc, None
        if width <= n:  # eigenvectors of the smaller Gram matrix
            self.gram = fc.transpose(1, 2) @ fc
            evals, vecs = per_matrix(torch.linalg.eigh, self.gram)
            self.q = fc @ vecs  # (k, N, F): Fc V, columns of squared norm evals
        else:
            evals, vecs = per_matrix(torch.linalg.eigh, fc @ fc.transpose(1, 2))
            self.q = vecs * evals.clamp_min(0).sqrt().unsqueeze(1)
        self.evals = evals.clamp_min(0)

    def loo(self, yc: Tensor, penalties: Tensor) -> Tensor:
        """(k, A) leave-one-out MSE for targets yc (k, N, d) at each penalty (k, A)."""
        return _loo(self.q, self.evals, yc, penalties)

    def head(self, yc: Tensor, penalty: Tensor) -> Tensor:
        """(k, F, d): the ridge weights for targets yc at penalty (k,)."""
        if self.gram is None:
            self.gram = self.fc.transpose(1, 2) @ self.fc
        return _head(self.gram.clone(), self.fc, yc, penalty)


def _loo(q: Tensor, evals: Tensor, yc: Tensor, penalties: Tensor) -> Tensor:
    n = q.shape[1]
    proj = q.transpose(1, 2) @ yc  # (k, F, d)
    shrink = 1 / (evals.unsqueeze(1) + penalties.unsqueeze(-1))  # (k, A, F)
    k, n_pen, d = len(q), penalties.shape[1], yc.shape[-1]
    coef = (shrink.unsqueeze(-1) * proj.unsqueeze(1)).permute(0, 2, 1, 3).reshape(k, -1, n_pen * d)  # (k, F, A d)
    fitted = (q @ coef).view(k, n, n_pen, d).transpose(1, 2)  # (k, A, N, d), one matmul per probe
    leverage = (q.pow(2) @ shrink.transpose(1, 2)).transpose(1, 2) + 1 / n  # (k, A, N)
    resid = (yc.unsqueeze(1) - fitted) / (1 - leverage).clamp_min(1e-12).unsqueeze(-1)
    return resid.pow(2).mean((2, 3))


class TwoBlockRidge:
    """Ridge on the features [Zc, Hc] with penalty (G,) on the Zc block and mu on the Hc block, for
    many mu at the price of one: block Cholesky of the penalised Gram matrix, L = [[L11, 0], [L21,
    L22]]; L11 and L21 (L11 L21^T = Zc^T Hc) do not depend on mu, and L22 L22^T = S + mu I with
    S = Hc^T Hc - L21 L21^T, so one eigendecomposition S = V diag(e) V^T serves every mu. With
    Q1 = L11^-1 Zc^T and T = V^T (Hc^T - L21 Q1): H_ii = |Q1_i|^2 + sum_j T_ji^2 / (e_j + mu) + 1/N,
    the fit is Q1^T Q1 Yc + T^T (e + mu)^-1 T Yc (as `ridge_loo`), and the coefficients are
    W_h = V (e + mu)^-1 T Yc, W_z = L11^-T (Q1 Yc - L21^T W_h)."""

    def __init__(self, zc: Tensor, hc: Tensor, yc: Tensor, penalty: Tensor):
        n = zc.shape[1]
        gram = zc.transpose(1, 2) @ zc
        gram.diagonal(dim1=1, dim2=2).add_(penalty.unsqueeze(-1))
        self.l11 = per_matrix(torch.linalg.cholesky, gram)
        q1 = per_matrix(lower_solve, self.l11, zc.transpose(1, 2))  # (G, D, N)
        self.l21t = per_matrix(lower_solve, self.l11, zc.transpose(1, 2) @ hc)  # (G, D, H)
        rest = hc.transpose(1, 2) - self.l21t.transpose(1, 2) @ q1  # (G, H, N): Hc^T - L21 Q1
        self.evals, self.vecs = per_matrix(
            torch.linalg.eigh, hc.transpose(1, 2) @ hc - self.l21t.transpose(1, 2) @ self.l21t
        )
        self.t = self.vecs.transpose(1, 2) @ rest  # (G, H, N)
        self.t_sq, self.ty, self.q1y = self.t.pow(2), self.t @ yc, q1 @ yc  # (G, H, N), (G, H, d), (G, D, d)
        self.yc = yc
        self.leverage = q1.pow(2).sum(1) + 1 / n  # (G, N)
        self.fitted = q1.transpose(1, 2) @ self.q1y

    def loo(self, hidden_penalties: Tensor) -> Tensor:
        """Leave-one-out MSE (G, S) for each column of hidden_penalties (G, S)."""
        out = []
        for column in hidden_penalties.unbind(1):
            inverse = 1 / (self.evals + column.unsqueeze(-1))  # (G, H)
            hidden_fit = self.t.transpose(1, 2) @ (inverse.unsqueeze(-1) * self.ty)
            hidden_leverage = (inverse.unsqueeze(1) @ self.t_sq).squeeze(1)
            resid = (self.yc - self.fitted - hidden_fit) / (1 - self.leverage - hidden_leverage).clamp_min(
                1e-12
            ).unsqueeze(-1)
            out.append(resid.pow(2).mean((1, 2)))
        return torch.stack(out, 1)

    def coef(self, hidden_penalty: Tensor, use_hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(W_z (G, D, d), W_h (G, H, d)) at hidden_penalty (G,); W_h = 0 (the Zc block alone) where
        use_hidden (G,) is false."""
        inverse = torch.where(use_hidden.unsqueeze(-1), 1 / (self.evals + hidden_penalty.unsqueeze(-1)), 0.0)
        w_h = self.vecs @ (inverse.unsqueeze(-1) * self.ty)
        w_z = per_matrix(upper_solve, self.l11.transpose(1, 2), self.q1y - self.l21t @ w_h)
        return w_z, w_h


def loo_two_blocks(zc: Tensor, hc: Tensor, yc: Tensor, penalty: Tensor, hidden_penalties: Tensor) -> Tensor:
    """Leave-one-out MSE (G, S) of ridge on the features [Zc, Hc] with penalty (G,) on the Zc block and
    each column of hidden_penalties (G, S) on the Hc block (`TwoBlockRidge`)."""
    return TwoBlockRidge(zc, hc, yc, penalty).loo(hidden_penalties)


def ridge_head(fc: Tensor, yc: Tensor, penalty: Tensor) -> Tensor:
    """(k, F, d): W = (Fc^T Fc + penalty I)^-1 Fc^T Yc, per probe."""
    return _head(fc.transpose(1, 2) @ fc, fc, yc, penalty)


def _head(gram: Tensor, fc: Tensor, yc: Tensor, penalty: Tensor) -> Tensor:
    """`ridge_head` with Fc^T Fc given (`gram`, overwritten)."""
    gram.diagonal(dim1=1, dim2=2).add_(penalty.unsqueeze(-1))
    chol, info = per_matrix(torch.linalg.cholesky_ex, gram)
    if bool((info == 0).all()):
        return per_matrix(cholesky_solve, chol, fc.transpose(1, 2) @ yc)
    return torch.linalg.lstsq(gram, fc.transpose(1, 2) @ yc).solution  # singular at penalty 0: least squares


def choose_penalty(fc: Tensor, yc: Tensor, penalties: Tensor) -> tuple[Tensor, Tensor]:
    """Per probe: the index (into penalties (k, A)) with the least leave-one-out error, and that error."""
    loo = ridge_loo(fc, yc, penalties)
    best = loo.argmin(-1)
    return best, loo.gather(1, best.unsqueeze(1)).squeeze(1)
