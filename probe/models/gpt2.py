"""The GPT-2 in-context regression model of Garg et al. (2022), `TransformerModel`.

Read-in Linear(d, D) -> GPT-2 backbone fed `inputs_embeds` -> read-out Linear(D, 1), with the
prediction for y_i read at the x_i token. Parameter names and shapes follow Hugging Face's
`GPT2Model` (Conv1D weights stored [in, out]) under `_backbone.`, so Garg et al.'s state dicts
load directly; the unused token embedding `wte` (50257 x D) is not kept (`export_garg` adds it).
Dropout is zero as in their config; activation is gelu_new; LayerNorm eps 1e-5.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..positions import x_positions
from .base import ModelOutput, ReadInOutModel
from .encoding import interleave

LN_EPS = 1e-5


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 linear layer: y = x @ W + b with W stored as (in, out)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # softmax(q k^T / sqrt(hs)) v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.c_proj = Conv1D(4 * n_embd, n_embd)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # gelu_new


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=LN_EPS)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=LN_EPS)
        self.mlp = MLP(n_embd)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Backbone(nn.Module):
    """GPT2Model without the token embedding (inputs are embeddings)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wpe = nn.Embedding(2 * cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg.n_embd, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=LN_EPS)


class GPT2ICL(ReadInOutModel, nn.Module):
    family = "gpt2"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self._read_in = nn.Linear(cfg.token_dim, cfg.n_embd)
        self._backbone = Backbone(cfg)
        self._read_out = nn.Linear(cfg.n_embd, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # Hugging Face GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
        nn.init.normal_(self._backbone.wpe.weight, std=0.02)
        for name, p in self._backbone.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def lens(self, resid: Tensor) -> Tensor:
        """The model's own read-out applied to any layer's raw stream: read_out(ln_f(h))."""
        return self.readout(self._backbone.ln_f(resid))

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        """Predictions and every layer boundary's residual stream for prompts xs (B, n, d), ys (B, n)."""
        n = xs.shape[1]
        tokens = interleave(xs, ys, self.config.encoding)  # (B, 2n, d)
        h = self._read_in(tokens) + self._backbone.wpe.weight[: 2 * n]  # (B, 2n, D)
        resid = [h]
        for block in self._backbone.h:
            h = block(h)
            resid.append(h)
        final = self._backbone.ln_f(h)
        pred = self.readout(final[:, x_positions(n)])  # (B, n)
        return ModelOutput(pred=pred, resid=resid, final=final)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred
