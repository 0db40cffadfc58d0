"""Models whose layers are known learners, by construction: ground truth for the analyses.

`LearnerOracle` implements the model protocol (probe.models.base.ICLModel) without any
weights: at layer boundary l its hidden state at each x token holds, in coordinate 0, the
prediction of a reference learner run with hyper-parameter k(l) on the examples before that
token (other coordinates carry independent noise). A retrained linear read-out therefore
recovers exactly that learner, so the heatmaps must put layer l at k(l).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..data.positions import X_TOKENS
from ..learners import run_learner
from .base import ModelOutput


class LearnerOracle(nn.Module):
    def __init__(
        self,
        learner: str,
        axis: str,
        schedule: Callable[[int], int],
        n_layers: int,
        n_dims: int,
        n_points: int,
        d_model: int = 8,
        fixed: dict[str, Any] | None = None,
        noise: float = 0.0,
        seed: int = 0,
    ):
        super().__init__()
        self.learner, self.axis, self.schedule = learner, axis, schedule
        self.n_layers, self.n_dims, self.n_points, self.d_model = n_layers, n_dims, n_points, d_model
        self.fixed = fixed or {}
        self.noise, self.seed = noise, seed  # the noise's own generator: the same seed, the same noise each run

    def readout(self, final: Tensor) -> Tensor:
        return final[..., 0]

    def lens(self, resid: Tensor) -> Tensor:
        return resid[..., 0]

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:

        b, n, _ = xs.shape
        ks = [self.schedule(l) for l in range(self.n_layers + 1)]
        grid: dict = {self.axis: tuple(sorted(set(ks))), **self.fixed}
        result = run_learner(self.learner, xs, ys, None, **grid)
        by_k = {g[self.axis]: i for i, g in enumerate(result.grid)}
        g = torch.Generator().manual_seed(self.seed)
        resid = []
        for k in ks:
            h = torch.zeros(b, 2 * n, self.d_model)
            h[:, X_TOKENS, 0] = result.preds[by_k[k]].float()
            if self.noise:
                h[:, :, 1:] = self.noise * torch.randn(b, 2 * n, self.d_model - 1, generator=g)
            resid.append(h)
        return ModelOutput(pred=resid[-1][:, X_TOKENS, 0], resid=resid, final=resid[-1])

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred
