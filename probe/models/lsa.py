"""Linear self-attention (LSA) transformers, the model of the in-context learning theory papers.

Parameterisation of Zhang, Frei & Bartlett (2024, eq. 3-4; von Oswald et al. 2023, Ahn et al. 2023
use the same): a token is the concatenation e = (x, y) of width d + 1, and one layer adds to every
token e_i

    e_i <- e_i + sum_h (1 / |K_i|) sum_{j in K_i} W_PV^h e_j (e_j^T W_KQ^h e_i)

with no softmax, no MLP and no LayerNorm; the prediction is the last (y) coordinate of the query
token after the last layer. Family "lsa_mlp" adds, optionally, what the papers leave out: GPT-2's
LayerNorm before the attention and a LayerNorm and GELU MLP (hidden 4 (d + 1)) after it, each a
residual update, with GPT-2's hook names (`ln1`/`ln2.hook_normalized`, `mlp.hook_pre` / `hook_post`,
`hook_resid_mid`, `hook_mlp_out`). Family "lsa" trains every entry of W_KQ and W_PV; family "lsa_sparse"
is Ahn et al.'s (2023, eq. 8) restriction W_KQ = [[A, 0], [0, 0]], W_PV = [[0, 0], [0, p]]: only
the y coordinates move, y_i <- y_i + (p / |K_i|) sum_j y_j x_j^T A^T x_i, so with p A = -eta P each
layer is a step of GD preconditioned by P on the labelled tokens' residuals y_j - x_j^T w, and the
query's y coordinate holds -x_q^T w: its prediction is read with the sign flipped (von Oswald
et al.'s and Ahn et al.'s convention). The prediction stays linear in y (the full form's is a
polynomial of degree 3^L, which at L = 4 overflows float32 on some prompts). ZFB's mask M = diag(I_N, 0) (the query is neither key nor value) and
their 1/N are kept: K_i is the set of labelled tokens e_i may see, and the sum is divided by its size.

To predict every prefix in one pass, as the other families do (Garg et al.'s objective, and every
analysis's "prefix t"), a prompt of n examples is the sequence of 2n tokens
(x_1, 0), (x_1, y_1), (x_2, 0), (x_2, y_2), ...: the query tokens (x_i, 0) at even positions, where
the prediction for y_i is read, and the labelled tokens (x_i, y_i) at odd positions, the only keys
and values. Attention is causal: a query token sees the i - 1 labelled tokens before it, a labelled
token the labelled tokens up to itself. At the last query of a prompt of N + 1 points this is ZFB's
model on N examples exactly (tests/test_lsa.py holds them equal).

Hook points are named as the GPT-2 family's (TransformerLens's names and layouts): `hook_embed`,
`blocks.{i}.hook_resid_pre`, `blocks.{i}.attn.hook_attn_scores` ([i, j] = e_j^T W_KQ e_i, (B, H, T, T)),
`blocks.{i}.attn.hook_pattern` (the scores masked and divided by |K_i|), `blocks.{i}.attn.hook_z`
((B, T, H, D)), `blocks.{i}.hook_attn_out` and `blocks.{i}.hook_resid_post`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from .base import ConfigSizes, ModelOutput
from .config import FAMILIES, ModelConfig
from .gpt2 import MLP, LayerNorm
from .hooked import Hooked, HookFn, HookPoint
from .linear import stable_addmm

INIT_STD = 0.02  # entries of W_KQ and W_PV at initialisation (both small: the zero point is a saddle)


def lsa_tokens(xs: Tensor, ys: Tensor) -> Tensor:
    """xs (B, n, d), ys (B, n) -> (B, 2n, d + 1): (x_i, 0) then (x_i, y_i) for each example."""
    query = torch.cat([xs, xs.new_zeros(*xs.shape[:2], 1)], dim=-1)
    labelled = torch.cat([xs, ys.unsqueeze(-1)], dim=-1)
    return torch.stack([query, labelled], dim=2).reshape(xs.shape[0], 2 * xs.shape[1], xs.shape[-1] + 1)


def visible_keys(tokens: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """(T, T) float mask / |K_i|: token i sees the labelled (odd) tokens j <= i, divided by their number
    (a row that sees none is zero: the first query predicts 0)."""
    pos = torch.arange(tokens, device=device)
    mask = ((pos[None, :] % 2 == 1) & (pos[None, :] <= pos[:, None])).to(dtype)
    return mask / mask.sum(-1, keepdim=True).clamp_min(1)


def sparse_masks(width: int) -> tuple[Tensor, Tensor]:
    """Ahn et al.'s pattern: W_KQ's x-by-x block and W_PV's y-by-y entry are free, the rest zero."""
    kq = torch.zeros(width, width)
    kq[:-1, :-1] = 1
    pv = torch.zeros(width, width)
    pv[-1, -1] = 1
    return kq, pv


def _stacked(w: Tensor) -> Tensor:
    """(H, D_out, D_in) -> (D_in, H * D_out): every head's W^T side by side, for one product."""
    return w.transpose(-1, -2).permute(1, 0, 2).reshape(w.shape[-1], -1)


class LinearAttention(nn.Module):
    """One LSA layer's heads: W_KQ^h and W_PV^h, (H, D, D) each (masked to Ahn et al.'s pattern when sparse)."""

    kq_mask: Tensor
    pv_mask: Tensor

    def __init__(self, heads: int, width: int, sparse: bool = False):
        super().__init__()
        self.w_kq = nn.Parameter(INIT_STD * torch.randn(heads, width, width))
        self.w_pv = nn.Parameter(INIT_STD * torch.randn(heads, width, width))
        self.sparse = sparse
        if sparse:
            kq, pv = sparse_masks(width)
            self.register_buffer("kq_mask", kq, persistent=False)
            self.register_buffer("pv_mask", pv, persistent=False)
            with torch.no_grad():  # the stored weights are the effective ones: the rest start (and stay) zero
                self.w_kq.mul_(kq)
                self.w_pv.mul_(pv)
        self.hook_attn_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()

    def weights(self) -> tuple[Tensor, Tensor]:
        """The effective (W_KQ, W_PV), (H, D, D) each."""
        if self.sparse:
            return self.w_kq * self.kq_mask, self.w_pv * self.pv_mask
        return self.w_kq, self.w_pv

    def forward(self, h: Tensor) -> Tensor:
        b, t, width = h.shape
        w_kq, w_pv = self.weights()
        heads = w_kq.shape[0]
        rows = h.reshape(b * t, width)
        # queries W_KQ e_i and values W_PV e_j for every head, each row as a large batch computes it
        q = stable_addmm(h.new_zeros(heads * width), rows, _stacked(w_kq))
        v = stable_addmm(h.new_zeros(heads * width), rows, _stacked(w_pv))
        q = q.view(b, t, heads, width).transpose(1, 2)  # (B, H, T, D)
        v = v.view(b, t, heads, width).transpose(1, 2)
        scores = self.hook_attn_scores(q @ h.unsqueeze(1).transpose(-1, -2))  # [i, j] = e_j^T W_KQ e_i
        pattern = self.hook_pattern(scores * visible_keys(t, h.device, h.dtype))
        z = self.hook_z((pattern @ v).transpose(1, 2))  # (B, T, H, D)
        return z.sum(2)


class LSABlock(nn.Module):
    """One residual LSA layer; with `mlp`, GPT-2's block around it: LayerNorm before the attention, then
    a LayerNorm and a GELU MLP (hidden 4 D) as a second residual update."""

    def __init__(self, heads: int, width: int, sparse: bool = False, mlp: bool = False):
        super().__init__()
        self.attn = LinearAttention(heads, width, sparse)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.with_mlp = mlp
        if mlp:
            self.ln_1, self.ln_2, self.mlp = LayerNorm(width), LayerNorm(width), MLP(width)
            self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()

    def forward(self, h: Tensor) -> Tensor:
        h = self.hook_resid_pre(h)
        if not self.with_mlp:
            return self.hook_resid_post(h + self.hook_attn_out(self.attn(h)))
        h = self.hook_resid_mid(h + self.hook_attn_out(self.attn(self.ln_1(h))))
        return self.hook_resid_post(h + self.hook_mlp_out(self.mlp(self.ln_2(h))))


@FAMILIES.register("lsa")
class LinearSelfAttentionICL(Hooked, ConfigSizes, nn.Module):
    """L layers of residual linear self-attention on concatenated (x, y) tokens (module docstring)."""

    capture_backend = "hooked"
    intervention_runner = "hooked"

    family = "lsa"
    sparse = False
    mlp = False  # lsa_mlp: GPT-2's LayerNorms and MLP around each attention layer
    attention_heads = True  # probe/models/base.py FamilyTraits
    sign = 1.0  # the prediction is sign * the y coordinate

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        super().check_config(cfg)
        if cfg.encoding != "garg":
            raise ConfigError("model.encoding does not apply to the lsa family (its tokens are (x, y)); remove it")
        if cfg.n_embd != cfg.n_dims + 1:
            raise ConfigError(
                f"an lsa model's width is its token's, d + 1 = {cfg.n_dims + 1}; set model.n_embd = {cfg.n_dims + 1}"
                f" (got {cfg.n_embd})"
            )

    @classmethod
    def parameter_count(cls, cfg: ModelConfig) -> int:
        """Stored parameters: W_KQ and W_PV per head and layer (the sparse form masks most of them), and
        in lsa_mlp two LayerNorms and the MLP per layer."""
        width = cfg.n_dims + 1
        extra = 4 * width + 8 * width**2 + 5 * width if cls.mlp else 0
        return cfg.n_layer * (cfg.n_head * 2 * width**2 + extra)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = cfg.n_dims + 1  # ModelConfig holds n_embd to it
        self.config = cfg
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(LSABlock(cfg.n_head, width, self.sparse, self.mlp) for _ in range(cfg.n_layer))
        self.name_hook_points((("ln_1.", "ln1."), ("ln_2.", "ln2.")))  # TransformerLens's names, as GPT-2's

    def readout(self, final: Tensor) -> Tensor:
        """The prediction: the token's y coordinate (negated in the sparse form)."""
        return self.sign * final[..., -1]

    def lens(self, resid: Tensor) -> Tensor:
        """The model's own read-out at any layer: the read-out applied to the stream."""
        return self.readout(resid)

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        """Predictions (B, n) at the query tokens and every layer boundary's stream (B, 2n, d + 1)."""
        h = self.hook_embed(lsa_tokens(xs, ys))
        resid = [h]
        for block in self.blocks:
            h = block(h)
            resid.append(h)
        return ModelOutput(pred=self.readout(h[:, 0::2]), resid=resid, final=h)

    def run_with_hooks(self, xs: Tensor, ys: Tensor, fwd_hooks: list[tuple[str, HookFn]]) -> ModelOutput:
        """`run` with (hook name, fn(value, hook)) pairs attached for this call."""
        with self.hooks(fwd_hooks):
            return self.run(xs, ys)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


@FAMILIES.register("lsa_sparse")
class SparseLinearSelfAttentionICL(LinearSelfAttentionICL):
    """LSA restricted to Ahn et al.'s (2023) preconditioned-GD pattern (module docstring)."""

    family = "lsa_sparse"
    sparse = True
    sign = -1.0


@FAMILIES.register("lsa_mlp")
class MLPLinearSelfAttentionICL(LinearSelfAttentionICL):
    """LSA with GPT-2's LayerNorms and GELU MLP around each attention layer (off in `lsa`)."""

    family = "lsa_mlp"
    mlp = True
