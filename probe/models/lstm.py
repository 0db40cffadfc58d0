"""An L-layer unidirectional LSTM over the same token sequence (Fu et al. 2024, §3.3).

Read-in Linear(d, D) -> L single-layer LSTMs stacked (kept separate so every layer's hidden
states are exposed) -> read-out Linear(D, 1) at the x tokens, exactly as the transformer.

Family "lstm_residual" adds each layer's input to its output (h <- h + LSTM(h), residual stacking
as in Wu et al. 2016's deep LSTMs): stacked plainly, 6- and 10-layer LSTMs at d = 8 stayed at the
predict-zero plateau for thousands of steps here, the residual 10-layer one did not.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..data.positions import x_positions
from .base import ModelOutput, ReadInOutModel
from .config import FAMILIES, ModelConfig
from .encoding import interleave
from .linear import StableLinear


@FAMILIES.register("lstm")
class LSTMICL(ReadInOutModel, nn.Module):
    family = "lstm"
    residual = False

    @staticmethod
    def parameter_count(cfg: ModelConfig) -> int:
        """Parameters of the model `cfg` describes: per layer nn.LSTM's four gates (weights and both
        biases), then the read-in and the read-out."""
        return cfg.n_layer * (8 * cfg.n_embd**2 + 8 * cfg.n_embd) + (cfg.token_dim + 1) * cfg.n_embd + cfg.n_embd + 1

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self._read_in = StableLinear(cfg.token_dim, cfg.n_embd)
        self._layers = nn.ModuleList(nn.LSTM(cfg.n_embd, cfg.n_embd, batch_first=True) for _ in range(cfg.n_layer))
        self._read_out = StableLinear(cfg.n_embd, 1)

    def lens(self, resid: Tensor) -> Tensor:
        """The model's own read-out applied to any layer's hidden state."""
        return self.readout(resid)

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        n = xs.shape[1]
        h = self._read_in(interleave(xs, ys, self.config.encoding))  # (B, 2n, D)
        resid = [h]
        for layer in self._layers:
            out, _ = layer(h)
            h = h + out if self.residual else out
            resid.append(h)
        pred = self.readout(h[:, x_positions(n)])
        return ModelOutput(pred=pred, resid=resid, final=h)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


@FAMILIES.register("lstm_residual")
class ResidualLSTMICL(LSTMICL):
    """The LSTM with residual stacking: h <- h + LSTM_l(h) (module docstring)."""

    family = "lstm_residual"
    residual = True
