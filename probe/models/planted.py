"""Transformers whose weights are set by hand to run a known learner: ground truth for analyses.

Architecture (shared by both constructions): linear self-attention layers (von Oswald et al.
2023, "Transformers learn in-context by gradient descent", eq. 1-2) with a linear skip map,

    h_j <- h_j + sum_heads c_head * sum_i (V h_i) <K h_i, Q h_j> + A h_j,

where c_head is 1/t (t = examples in the prompt) or 1, and no LayerNorm or MLP. Each prediction
for x_{t+1} is computed by one run over the first t examples (full attention among them, as in
von Oswald et al.'s one-query setting), so causality holds by construction; all prefixes run
at once. The read-out is a fixed linear map of the query token.

GD (`planted="gd"`, eta = planted_scale): tokens [x-slot, r-slot, xq-slot]; examples start as
(x_i, y_i), the query as (x_q, 0). One head with Q = K = x (xq for the query), V = -eta r:
r_j <- r_j - eta/t sum_i r_i <x_i, x_j>, so after l layers r_i = y_i - w_l.x_i and
r_q = -w_l.x_q, w_l being l steps of GD on ||y - Xw||^2/(2t) from 0 (seed 003 eq. 6, paper
convention). Read-out: -r_q. Layer l = GD step l.

Newton (`planted="newton"`, alpha = planted_scale): Iterative Newton (seed 003 eq. 8) on the
normalised moment S/t with a fixed M_0 = alpha S/t, using d extra "column" tokens that carry the
columns m_j of M_k (hidden size O(d), as seed 003 Thm. 1; linear instead of ReLU attention).
Layer 1: m_j = alpha/t sum_i x_i <x_i, e_j>, and the query gathers b = 1/t sum_i y_i x_i.
Then two layers per iteration: (A) u_j = S m_j / t (columns attend to examples) and
z = M_k x_q (query attends to columns); (B) m_j <- 2 m_j - M_k u_j (columns attend to columns)
and p = 1/t sum_i y_i <x_i, z> = x_q . M_k b (query attends to examples). Read-out: p.
Layer map: boundaries 0-2 predict 0; boundary l >= 3 holds iteration (l - 3) // 2.
Matching learner: newton with alpha = planted_scale (a number: fixed scale on S/t).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .base import ModelOutput


def gd_stable_limit(d: int) -> float:
    """Largest step eta for which GD on ||y - Xw||^2/(2t) stays stable on typical prompts:
    2 / (1 + sqrt(d))^2, the Marchenko-Pastur edge of S/t at t = 1 (seed 003 §2, REFERENCE §2)."""
    return 2.0 / (1 + math.sqrt(d)) ** 2


def newton_default_alpha(d: int) -> float:
    """A fixed alpha with alpha * lambda_max(S/t)^2 < 2 on all but ~1e-4 of short prefixes."""
    return 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2


class Layout:
    """Named slots of the token vector."""

    def __init__(self, algorithm: str, d: int):
        names = [("x", d), ("r", 1), ("xq", d)] if algorithm == "gd" else \
            [("x", d), ("y", 1), ("xq", d), ("one", 1), ("e", d), ("m", d), ("u", d), ("b", d), ("z", d), ("p", 1)]
        self.slots, start = {}, 0
        for name, size in names:
            self.slots[name] = slice(start, start + size)
            start += size
        self.width = start

    def __getitem__(self, name: str) -> slice:
        return self.slots[name]


class PlantedICL(nn.Module):
    family = "planted"
    q: nn.Parameter  # (L, heads, W, W) query maps
    k: nn.Parameter
    v: nn.Parameter
    skip: nn.Parameter  # (L, W, W)
    per_example: Tensor  # (L, heads) buffer: 1 scales the head by 1/t
    read: nn.Parameter  # (W,)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.layout = Layout(cfg.planted, cfg.n_dims)
        w, heads = self.layout.width, 2
        self.q = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.k = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.v = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.skip = nn.Parameter(torch.zeros(cfg.n_layer, w, w), requires_grad=False)
        self.register_buffer("per_example", torch.zeros(cfg.n_layer, heads))  # 1: scale the head by 1/t
        self.read = nn.Parameter(torch.zeros(w), requires_grad=False)

    # -- the protocol
    n_dims = property(lambda self: self.config.n_dims)
    n_layers = property(lambda self: self.config.n_layer)
    d_model = property(lambda self: self.layout.width)
    n_points = property(lambda self: self.config.n_positions)

    def readout(self, final: Tensor) -> Tensor:
        return final @ self.read

    def lens(self, resid: Tensor) -> Tensor:
        return self.readout(resid)

    def tokens(self, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Runs for every prefix: tokens (B, n, T, W) and example counts t (n,).

        Token order in run t: the n example slots (only the first t are examples), the d column
        tokens (Newton), then the query x_{t+1}."""
        b, n, d = xs.shape
        s, ly = self.layout, self.layout.width
        n_cols = d if self.config.planted == "newton" else 0
        h = xs.new_zeros(b, n, n + n_cols + 1, ly)
        seen = (torch.arange(n).view(1, n) < torch.arange(n).view(n, 1)).to(xs.dtype).view(1, n, n, 1)  # (run t, i)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        if self.config.planted == "gd":
            h[:, :, :n, s["r"]] = ys.view(b, 1, n, 1) * seen
        else:
            h[:, :, :n, s["y"]] = ys.view(b, 1, n, 1) * seen
            h[:, :, n : n + d, s["e"]] = torch.eye(d, dtype=xs.dtype)
            h[:, :, -1, s["one"]] = 1.0
        h[:, :, -1, s["xq"]] = xs  # run t queries x_{t+1}
        return h, torch.arange(n, dtype=xs.dtype)

    def layer(self, h: Tensor, l: int, t: Tensor) -> Tensor:
        out = h + h @ self.skip[l].T
        scale = torch.where(t > 0, 1 / t.clamp_min(1), torch.zeros_like(t)).view(1, -1, 1, 1)
        for head in range(self.q.shape[1]):
            if not (self.q[l, head].any() and self.v[l, head].any()):
                continue
            q, k, v = h @ self.q[l, head].T, h @ self.k[l, head].T, h @ self.v[l, head].T
            att = (q @ k.transpose(-1, -2)) @ v  # (B, n, T, W): sum_i <K h_i, Q h_j> V h_i, linear attention
            out = out + att * (scale if self.per_example[l, head] else 1.0)
        return out

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        h, t = self.tokens(xs.to(self.q.dtype), ys.to(self.q.dtype))
        states = [h]
        for l in range(self.config.n_layer):
            h = self.layer(h, l, t)
            states.append(h)
        resid = [self.interleave_runs(state) for state in states]
        return ModelOutput(pred=self.readout(resid[-1][:, 0::2]), resid=resid, final=resid[-1])

    @staticmethod
    def interleave_runs(state: Tensor) -> Tensor:
        """Per-run token states (B, n, T, W) -> the x_1, y_1, ... layout (B, 2n, W): x token t is
        the query of run t, y token t is example t in run t+1 (the last run for the last one)."""
        b, n = state.shape[:2]
        idx = torch.arange(n)
        seq = state.new_zeros(b, 2 * n, state.shape[-1])
        seq[:, 0::2] = state[:, :, -1]
        seq[:, 1::2] = state[:, (idx + 1).clamp(max=n - 1), idx]
        return seq

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


def _sel(layout: Layout, width: int, rows: str, cols: str, scale: float = 1.0) -> Tensor:
    """A (width, width) matrix copying slot `cols` of the input into slot `rows` of the output."""
    m = torch.zeros(width, width)
    r, c = layout[rows], layout[cols]
    m[r, c] = scale * torch.eye(r.stop - r.start)
    return m


def plant(cfg: ModelConfig) -> PlantedICL:
    """A PlantedICL with the weights of its construction (see the module docstring)."""
    model = PlantedICL(cfg)
    s, w = model.layout, model.layout.width
    with torch.no_grad():
        if cfg.planted == "gd":
            for l in range(cfg.n_layer):
                model.q[l, 0] = _sel(s, w, "x", "x") + _sel(s, w, "x", "xq")  # query: x_j (or x_q)
                model.k[l, 0] = _sel(s, w, "x", "x")  # keys: examples' x (zero elsewhere)
                model.v[l, 0] = _sel(s, w, "r", "r", -cfg.planted_scale)
                model.per_example[l, 0] = 1
            model.read[s["r"]] = -1.0
            return model
        alpha = cfg.planted_scale
        # layer 0: M_0 = alpha S/t into the column tokens, b = X^T y / t into the query
        model.q[0, 0], model.k[0, 0], model.v[0, 0] = _sel(s, w, "x", "e"), _sel(s, w, "x", "x"), _sel(s, w, "m", "x", alpha)
        model.q[0, 1], model.k[0, 1], model.v[0, 1] = _sel(s, w, "one", "one"), _sel(s, w, "one", "y"), _sel(s, w, "b", "x")
        model.per_example[0] = 1
        for l in range(1, cfg.n_layer):
            if l % 2 == 1:  # (A) u_j = S m_j / t; z = M x_q
                model.q[l, 0], model.k[l, 0], model.v[l, 0] = _sel(s, w, "x", "m"), _sel(s, w, "x", "x"), _sel(s, w, "u", "x")
                model.per_example[l, 0] = 1
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = _sel(s, w, "e", "xq"), _sel(s, w, "e", "e"), _sel(s, w, "z", "m")
            else:  # (B) m_j <- 2 m_j - M u_j, clear u; p = b . M x_q via examples, clear z
                model.q[l, 0], model.k[l, 0], model.v[l, 0] = _sel(s, w, "e", "u"), _sel(s, w, "e", "e"), _sel(s, w, "m", "m", -1.0)
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = _sel(s, w, "x", "z"), _sel(s, w, "x", "x"), _sel(s, w, "p", "y")
                model.per_example[l, 1] = 1
                model.skip[l] = _sel(s, w, "m", "m") - _sel(s, w, "u", "u") - _sel(s, w, "z", "z") - _sel(s, w, "p", "p")
        model.read[s["p"]] = 1.0
    return model


def newton_layer_map(layer: int) -> int | None:
    """The Newton iteration whose prediction boundary `layer` holds (None: it predicts 0)."""
    return (layer - 3) // 2 if layer >= 3 else None
