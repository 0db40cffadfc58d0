"""Per-layer readout retraining (Fu et al. 2024, §4.1, Def. 3): a fresh u^T h + v on each frozen layer.

The reports' read-outs come from `fit_layer_readouts`: it scores every layer and every ridge
penalty in one batched solve and keeps per layer the penalty with the lowest error on validation
prompts. `RidgeReadout` is the same read-out for one layer as a scikit-learn estimator, for users'
own pipelines: the reports do not construct it, and a test holds its fit equal to the layer's
solution `fit_layer_readouts` keeps. With a read-out each layer becomes a predictor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from ..core.allocator import release_free_memory
from ..core.config import Section, setting
from ..core.seeds import Stream, stream_generator
from ..data.metrics import error_per_dim
from .stats import bootstrap_mean

READOUT_METHODS = ("ridge", "adam", "model")


@dataclass
class ReadoutSettings(Section):
    """Per-layer read-outs (probe/analysis/readout.py): recipe section [readout]."""

    SECTION = "readout"

    method: str = setting(
        "ridge", "closed-form ridge, ridge fine-tuned by Adam, or the model's own read-out", READOUT_METHODS
    )
    alphas: tuple[float, ...] = setting(
        (1e-6, 1e-4, 1e-2, 1.0), "ridge penalties, one chosen per layer on validation", nonempty=True
    )
    finetune_steps: int = setting(500, "Adam steps of the 'adam' method", minimum=0)


ALPHAS = (1e-6, 1e-4, 1e-2, 1.0)


def _design(h: torch.Tensor) -> torch.Tensor:
    """Append a constant column for the intercept v: (..., D) -> (..., D+1)."""
    return torch.cat([h, torch.ones_like(h[..., :1])], dim=-1)


def ridge_solve(gram: torch.Tensor, rhs: torch.Tensor, alphas: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Solve (G + alpha*N I') beta = r for every alpha; the intercept is not penalised.

    gram (L, D+1, D+1), rhs (L, D+1) -> (A, L, D+1). The penalty is scaled by the number of rows
    so that alpha means the same at any sample size. The systems are symmetric positive definite
    (for alpha > 0, and at alpha = 0 on full-rank features), solved by Cholesky; one that is not
    (alpha = 0 on collinear features) gets the minimum-norm least-squares solution, as
    scikit-learn's LinearRegression. Not by LU: in torch 2.13's CPU build, once
    torch.set_num_threads(n > 1) has been called, MKL's batched LU of systems from about 200 x 200
    on fails or returns wrong solutions, and a read-out at Garg et al.'s width 256 solves 257 x 257.
    """
    dim = gram.shape[-1]
    pen = torch.eye(dim, dtype=gram.dtype)
    pen[-1, -1] = 0
    systems = gram.unsqueeze(0) + alphas.view(-1, 1, 1, 1) * n_rows * pen
    rhs = rhs.unsqueeze(0).expand(len(alphas), *rhs.shape).unsqueeze(-1)
    chol, info = torch.linalg.cholesky_ex(systems)
    solution = torch.cholesky_solve(rhs, chol)
    singular = info != 0  # alpha = 0 on collinear features: the minimum-norm least-squares solution
    if bool(singular.any()):
        solution[singular] = torch.linalg.pinv(systems[singular], hermitian=True) @ rhs[singular]
    return solution.squeeze(-1)


class RidgeReadout(RegressorMixin, BaseEstimator):
    """Linear read-out y ~ u.h + v with an L2 penalty alpha * N * ||u||^2 on u only: a
    scikit-learn estimator (get/set_params, score, Pipeline, GridSearchCV). Equal to
    sklearn.linear_model.Ridge(alpha=alpha * N) on the same data (tested)."""

    def __init__(self, alpha: float = 1e-4):
        self.alpha = alpha

    def fit(self, X, y) -> RidgeReadout:

        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        if not np.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"RidgeReadout alpha must be a finite number >= 0, got {self.alpha!r}")
        a = _design(torch.from_numpy(np.array(X, dtype=np.float64)))  # a writable copy for torch
        yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
        beta = ridge_solve(
            (a.T @ a)[None], (a.T @ yt)[None], torch.tensor([float(self.alpha)], dtype=torch.float64), len(yt)
        )
        self.coef_ = beta[0, 0, :-1].numpy()
        self.intercept_ = float(beta[0, 0, -1])
        return self

    def predict(self, X) -> np.ndarray:

        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_ + self.intercept_


@dataclass
class LayerReadouts:
    coef: np.ndarray  # (L+1, D)
    intercept: np.ndarray  # (L+1,)
    alpha: np.ndarray  # (L+1,) chosen penalty per layer
    val_error: np.ndarray  # (A, L+1) validation MSE of every penalty

    def to_json(self) -> dict[str, list]:
        """The fitted arrays as JSON lists (float64 round-trips exactly), e.g. for a stage cache."""
        return {f.name: getattr(self, f.name).tolist() for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, list]) -> LayerReadouts:
        return cls(**{name: np.asarray(value, dtype=np.float64) for name, value in data.items()})

    def predict(self, states: np.ndarray) -> np.ndarray:
        """states (L+1, ..., D) -> predictions (L+1, ...), one layer at a time (in float64)."""
        return np.stack([self.predict_layer(layer, s) for layer, s in enumerate(np.asarray(states))])

    def predict_layer(self, layer: int, states: np.ndarray) -> np.ndarray:
        """Layer `layer`'s read-out of states (..., D)."""
        return np.asarray(states, dtype=np.float64) @ self.coef[layer] + self.intercept[layer]


def fit_layer_readouts(
    train_states: np.ndarray,
    train_ys: np.ndarray,
    val_states: np.ndarray,
    val_ys: np.ndarray,
    alphas: Sequence[float] = ALPHAS,
) -> LayerReadouts:
    """Closed-form ridge read-outs for every layer, penalty chosen on validation prompts.

    train_states (L+1, P, n, D) at the x tokens, train_ys (P, n); likewise for validation. Works one
    layer at a time in float64, so at most one layer's states are converted at once.
    """
    y = torch.as_tensor(np.asarray(train_ys), dtype=torch.float64).flatten()
    yv = torch.as_tensor(np.asarray(val_ys), dtype=torch.float64).flatten()
    alphas_t = torch.tensor(list(alphas), dtype=torch.float64)
    grams, rhss = [], []
    for layer_states in train_states:
        a = _layer_design(layer_states)  # (P*n, D+1)
        grams.append(a.T @ a)
        rhss.append(a.T @ y)
        del a
        release_free_memory()  # a layer's design matrices leave the heap before the next layer's (fragmentation)
    beta = ridge_solve(torch.stack(grams), torch.stack(rhss), alphas_t, len(y))  # (A, L+1, D+1)
    val_err = torch.stack(
        [((_layer_design(s) @ beta[:, layer].T - yv[:, None]) ** 2).mean(0) for layer, s in enumerate(val_states)],
        dim=1,
    )  # (A, L+1)
    best = val_err.argmin(0)
    # each layer's solution at its chosen penalty is already among the solved systems: the system
    # RidgeReadout(alpha).fit solves on these states (equal to round-off, tested)
    chosen = beta[best, torch.arange(beta.shape[1])].numpy()  # (L+1, D+1)
    return LayerReadouts(chosen[:, :-1].copy(), chosen[:, -1].copy(), alphas_t[best].numpy(), val_err.numpy())


def _layer_design(states) -> torch.Tensor:
    """One layer's states (P, n, D) as a float64 design matrix with an intercept column (P*n, D+1)."""
    return _design(torch.as_tensor(np.asarray(states), dtype=torch.float64).flatten(0, 1))


def finetune_layer_readouts(
    readouts: LayerReadouts,
    train_states: np.ndarray,
    train_ys: np.ndarray,
    steps: int = 500,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
) -> LayerReadouts:
    """Gradient fine-tuning of all layers' read-outs at once with Adam on minibatches of prompts
    (the Iterative Newton paper's code trains read-outs this way)."""
    h = torch.as_tensor(np.asarray(train_states), dtype=torch.float32)  # (L+1, P, n, D)
    y = torch.as_tensor(np.asarray(train_ys), dtype=torch.float32)
    coef = torch.tensor(readouts.coef, dtype=torch.float32, requires_grad=True)
    bias = torch.tensor(readouts.intercept, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([coef, bias], lr=lr)
    g = stream_generator(seed, Stream.READOUT_MINIBATCHES)
    for _ in range(steps):
        idx = torch.randint(0, h.shape[1], (batch_size,), generator=g)
        pred = torch.einsum("lpnd,ld->lpn", h[:, idx], coef) + bias.view(-1, 1, 1)
        loss = ((pred - y[idx]) ** 2).mean(dim=(1, 2)).sum()  # independent per layer
        opt.zero_grad()
        loss.backward()
        opt.step()
    return LayerReadouts(
        coef.detach().double().numpy(), bias.detach().double().numpy(), readouts.alpha, readouts.val_error
    )


def readout_table(
    layer_preds: np.ndarray, ys: np.ndarray, n_dims: int, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Error / d per layer and number of examples with bootstrap 5-95% bands over prompts.

    layer_preds (L+1, B, n), ys (B, n) -> rows (layer, n_examples, error, ci_low, ci_high)."""
    err = error_per_dim(
        torch.as_tensor(layer_preds, dtype=torch.float64), torch.as_tensor(ys, dtype=torch.float64), n_dims
    )
    err = err.permute(1, 0, 2)  # (B, L+1, n)
    lo, hi = bootstrap_mean(err, n_boot=n_boot, seed=seed)
    mean = err.mean(0)
    rows = [
        {"layer": l, "n_examples": t, "error": float(mean[l, t]), "ci_low": float(lo[l, t]), "ci_high": float(hi[l, t])}
        for l in range(mean.shape[0])
        for t in range(mean.shape[1])
    ]
    return pd.DataFrame(rows)
