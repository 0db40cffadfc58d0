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

Newton with ReLU attention (`planted="newton-relu"`, alpha = planted_scale): the construction of
seed 003 Thm. 1 (App. B.2). Every head is a full-attention ReLU head of Def. 5 (eq. 17),
sigma(a) = ReLU(a)/t; a product a.V is the pair ReLU(a) V - ReLU(-a) V (heads 2k and 2k+1, the
second with Q and V negated). Tokens [x, y, xq, tx, tq, p] (hidden size 4d + 2); example i starts
as (x_i, y_i), the query as x_q. Layer 0 (eq. 20-23): T^(0) x = alpha S/t x into tx (examples) and
tq (query). Layer l >= 1: the attention of eq. 26-28 gives T x_t - 1/2 T (S/t) T x_t, the MLP of
eq. 29 (hidden size 4d, ReLU(a) - ReLU(-a) = a) doubles the tx and tq slots, so
T^(l) = 2 T^(l-1) - T^(l-1) (S/t) T^(l-1) (eq. 31); a third head pair writes the prediction
p = 1/t sum_i y_i <x_i, T^(l-1) x_q> = x_q . T^(l-1) X^T y / t, replacing the previous p (skip map).
Layer map: boundaries 0-1 predict 0; boundary l >= 2 holds iteration l - 2: one layer per
iteration, against two for the linear-attention construction above.
Deviations from the paper, all stated: (i) eq. 20 and 27 take V_1 = V_2 with
Q_2^T K_2 = -Q_1^T K_1, which sums to |a| V, not a V; the pair needs V_2 = -V_1. (ii) The factor n
of Q (-n/2 I) and V (n alpha I) is dropped, so T iterates Newton on S/t with M_0 = alpha S/t:
the same w_k as the paper's Newton on S with alpha/t^2. (iii) The mov / aff steps of eq. 19 and 22
are folded into the embedding (T x starts in its own zero slot). (iv) The read-out of eq. 32-34
(mov, mul, Lemma 1, mov, mul after the last iteration) is replaced by one head pair per layer, so
that every layer boundary can be read out; the query keeps T x_q in its own slot, so that, as in
eq. 17's sum over the examples only, it is never a key.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..positions import X_TOKENS, Y_TOKENS, prefix_mask
from .base import ModelOutput


def gd_stable_limit(d: int) -> float:
    """Largest step eta for which GD on ||y - Xw||^2/(2t) stays stable on typical prompts:
    2 / (1 + sqrt(d))^2, the Marchenko-Pastur edge of S/t at t = 1 (seed 003 §2, REFERENCE §2)."""
    return 2.0 / (1 + math.sqrt(d)) ** 2


def newton_default_alpha(d: int) -> float:
    """A fixed alpha with alpha * lambda_max(S/t)^2 < 2 on all but ~1e-4 of short prefixes."""
    return 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2


HEADS = {"gd": 2, "newton": 2, "newton-relu": 6}  # attention heads per layer (the bridge adds one for the skip map)


class Layout:
    """Named slots of the token vector."""

    def __init__(self, algorithm: str, d: int):
        names = {
            "gd": [("x", d), ("r", 1), ("xq", d)],
            "newton": [
                ("x", d),
                ("y", 1),
                ("xq", d),
                ("one", 1),
                ("e", d),
                ("m", d),
                ("u", d),
                ("b", d),
                ("z", d),
                ("p", 1),
            ],
            "newton-relu": [("x", d), ("y", 1), ("xq", d), ("tx", d), ("tq", d), ("p", 1)],
        }[algorithm]
        self.slots, start = {}, 0
        for name, size in names:
            self.slots[name] = slice(start, start + size)
            start += size
        self.width = start

    def __getitem__(self, name: str) -> slice:
        return self.slots[name]


class PlantedICL(nn.Module):
    family = "planted"
    capture_backend = "planted"  # probe/capture/backends.py
    runner = "planted"  # probe/interventions/runner.py
    q: nn.Parameter  # (L, heads, W, W) query maps
    k: nn.Parameter
    v: nn.Parameter
    skip: nn.Parameter  # (L, W, W)
    per_example: Tensor  # (L, heads) buffer: 1 scales the head by 1/t
    read: nn.Parameter  # (W,)
    mlp_in: nn.Parameter  # (L, 4d, W), ReLU MLP of "newton-relu" only
    mlp_out: nn.Parameter  # (L, W, 4d)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.layout = Layout(cfg.planted, cfg.n_dims)
        self.relu_attention = cfg.planted == "newton-relu"
        w, heads = self.layout.width, HEADS[cfg.planted]
        self.q = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.k = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.v = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.skip = nn.Parameter(torch.zeros(cfg.n_layer, w, w), requires_grad=False)
        self.register_buffer("per_example", torch.zeros(cfg.n_layer, heads))  # 1: scale the head by 1/t
        self.read = nn.Parameter(torch.zeros(w), requires_grad=False)
        self.d_mlp = 4 * cfg.n_dims if self.relu_attention else 0
        if self.d_mlp:
            self.mlp_in = nn.Parameter(torch.zeros(cfg.n_layer, self.d_mlp, w), requires_grad=False)
            self.mlp_out = nn.Parameter(torch.zeros(cfg.n_layer, w, self.d_mlp), requires_grad=False)

    @property
    def n_extra_tokens(self) -> int:
        """Tokens between the example slots and the query in each run (Newton's column tokens)."""
        return self.config.n_dims if self.config.planted == "newton" else 0

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention weights [j, i] = <K h_i, Q h_j> (linear attention) or its ReLU (Def. 5, eq. 17)."""
        s = q @ k.transpose(-1, -2)
        return s.relu() if self.relu_attention else s

    def mlp(self, h: Tensor, l: int) -> Tensor:
        return (h @ self.mlp_in[l].T).relu() @ self.mlp_out[l].T

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
        n_cols = self.n_extra_tokens
        h = xs.new_zeros(b, n, n + n_cols + 1, ly)
        seen = prefix_mask(n).to(xs.dtype).view(1, n, n, 1)  # (run t, i)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        if self.config.planted == "gd":
            h[:, :, :n, s["r"]] = ys.view(b, 1, n, 1) * seen
        else:
            h[:, :, :n, s["y"]] = ys.view(b, 1, n, 1) * seen
        if self.config.planted == "newton":
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
            att = self.scores(q, k) @ v  # (B, n, T, W): sum_i sigma(<K h_i, Q h_j>) V h_i
            out = out + att * (scale if self.per_example[l, head] else 1.0)
        return out + self.mlp(out, l) if self.d_mlp else out

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        h, t = self.tokens(xs.to(self.q.dtype), ys.to(self.q.dtype))
        states = [h]
        for l in range(self.config.n_layer):
            h = self.layer(h, l, t)
            states.append(h)
        resid = [self.interleave_runs(state) for state in states]
        return ModelOutput(pred=self.readout(resid[-1][:, X_TOKENS]), resid=resid, final=resid[-1])

    @staticmethod
    def interleave_runs(state: Tensor) -> Tensor:
        """Per-run token states (B, n, T, W) -> the x_1, y_1, ... layout (B, 2n, W): x token t is
        the query of run t, y token t is example t in run t+1 (the last run for the last one)."""
        b, n = state.shape[:2]
        idx = torch.arange(n)
        seq = state.new_zeros(b, 2 * n, state.shape[-1])
        seq[:, X_TOKENS] = state[:, :, -1]
        seq[:, Y_TOKENS] = state[:, (idx + 1).clamp(max=n - 1), idx]
        return seq

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


def _sel(layout: Layout, width: int, rows: str, cols: str, scale: float = 1.0) -> Tensor:
    """A (width, width) matrix copying slot `cols` of the input into slot `rows` of the output."""
    m = torch.zeros(width, width)
    r, c = layout[rows], layout[cols]
    m[r, c] = scale * torch.eye(r.stop - r.start)
    return m


def _plant_relu_newton(model: PlantedICL) -> None:
    """Seed 003 Thm. 1 with ReLU attention (module docstring): head pairs (2k, 2k+1) form a.V."""
    s, w, alpha = model.layout, model.layout.width, model.config.planted_scale

    def pair(l: int, k: int, q: Tensor, key: Tensor, v: Tensor) -> None:
        for head, sign in ((2 * k, 1.0), (2 * k + 1, -1.0)):  # ReLU(a) V + ReLU(-a) (-V) = a V
            model.q[l, head], model.k[l, head], model.v[l, head] = sign * q, key, sign * v
            model.per_example[l, head] = 1  # sigma(a) = ReLU(a) / t

    x_key = _sel(s, w, "x", "x")
    pair(0, 0, _sel(s, w, "x", "x"), x_key, _sel(s, w, "tx", "x", alpha))  # eq. 21: tx = alpha S/t x_t
    pair(0, 1, _sel(s, w, "x", "xq"), x_key, _sel(s, w, "tq", "x", alpha))  # and tq = alpha S/t x_q
    d = model.n_dims
    for l in range(1, model.config.n_layer):
        t_key = _sel(s, w, "x", "tx")  # keys T x_j of the examples
        pair(l, 0, _sel(s, w, "x", "x", -0.5), t_key, _sel(s, w, "tx", "tx"))  # eq. 28: T x - 1/2 T S/t T x
        pair(l, 1, _sel(s, w, "x", "xq", -0.5), t_key, _sel(s, w, "tq", "tx"))  # the same for the query
        pair(l, 2, _sel(s, w, "x", "tq"), x_key, _sel(s, w, "p", "y"))  # p = 1/t sum_i y_i <x_i, T x_q>
        model.skip[l] = -_sel(s, w, "p", "p")  # the new p replaces the old
        for block, slot in enumerate(("tx", "tq")):  # eq. 29: h + [I 0; 0 0] h as W_out ReLU(W_in h)
            rows = slice(2 * d * block, 2 * d * block + 2 * d)
            eye = torch.eye(d)
            model.mlp_in[l, rows, s[slot]] = torch.cat([eye, -eye])
            model.mlp_out[l, s[slot], rows] = torch.cat([eye, -eye], dim=1)
    model.read[s["p"]] = 1.0


def plant(cfg: ModelConfig) -> PlantedICL:
    """A PlantedICL with the weights of its construction (see the module docstring)."""
    model = PlantedICL(cfg)
    s, w = model.layout, model.layout.width
    with torch.no_grad():
        if cfg.planted == "newton-relu":
            _plant_relu_newton(model)
            return model
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
        model.q[0, 0], model.k[0, 0], model.v[0, 0] = (
            _sel(s, w, "x", "e"),
            _sel(s, w, "x", "x"),
            _sel(s, w, "m", "x", alpha),
        )
        model.q[0, 1], model.k[0, 1], model.v[0, 1] = (
            _sel(s, w, "one", "one"),
            _sel(s, w, "one", "y"),
            _sel(s, w, "b", "x"),
        )
        model.per_example[0] = 1
        for l in range(1, cfg.n_layer):
            if l % 2 == 1:  # (A) u_j = S m_j / t; z = M x_q
                model.q[l, 0], model.k[l, 0], model.v[l, 0] = (
                    _sel(s, w, "x", "m"),
                    _sel(s, w, "x", "x"),
                    _sel(s, w, "u", "x"),
                )
                model.per_example[l, 0] = 1
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                    _sel(s, w, "e", "xq"),
                    _sel(s, w, "e", "e"),
                    _sel(s, w, "z", "m"),
                )
            else:  # (B) m_j <- 2 m_j - M u_j, clear u; p = b . M x_q via examples, clear z
                model.q[l, 0], model.k[l, 0], model.v[l, 0] = (
                    _sel(s, w, "e", "u"),
                    _sel(s, w, "e", "e"),
                    _sel(s, w, "m", "m", -1.0),
                )
                model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                    _sel(s, w, "x", "z"),
                    _sel(s, w, "x", "x"),
                    _sel(s, w, "p", "y"),
                )
                model.per_example[l, 1] = 1
                model.skip[l] = (
                    _sel(s, w, "m", "m") - _sel(s, w, "u", "u") - _sel(s, w, "z", "z") - _sel(s, w, "p", "p")
                )
        model.read[s["p"]] = 1.0
    return model
