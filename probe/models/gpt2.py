"""The GPT-2 in-context regression model of Garg et al. (2022), `TransformerModel`.

Read-in Linear(d, D) -> GPT-2 backbone fed `inputs_embeds` -> read-out Linear(D, 1), with the
prediction for y_i read at the x_i token. Parameter names and shapes follow Hugging Face's
`GPT2Model` (Conv1D weights stored [in, out]) under `_backbone.`, so Garg et al.'s state dicts
load directly; the unused token embedding `wte` (50257 x D) is not kept (`export_garg` adds it).
Dropout is zero as in their config; activation is gelu_new; LayerNorm eps 1e-5.

This file is the one execution path of the family: training, capture, SimW query states and the
causal checks all run these blocks. Their activation sites are `HookPoint`s named as
TransformerLens names them (`hook_embed`, `blocks.{i}.hook_resid_pre`, `blocks.{i}.ln1.hook_normalized`,
`blocks.{i}.attn.hook_q` / `hook_k` / `hook_v` / `hook_attn_scores` / `hook_pattern` / `hook_z`,
`blocks.{i}.hook_attn_out`, `hook_resid_mid`, `ln2.hook_normalized`, `mlp.hook_pre`, `mlp.hook_post`,
`hook_mlp_out`, `hook_resid_post`, `ln_final.hook_normalized`), with TransformerLens's layouts
(queries, keys, values and z as (B, T, heads, d_head)); `run_with_hooks` reads or edits them
(probe/models/hooked.py), and tests hold each equal to the TransformerBridge of `probe.to_bridge`
at the same name (hook_attn_scores, which that bridge reports after the softmax, by hand).
What the fast paths need are options of `resume`: the keys and values of tokens that come
before the window (a key/value cache, as Hugging Face's `past_key_values`), which of them each
window copy sees, a start and stop block, and the last token only; the hook points fire there
too, so ablations run as hooks on either path. Residual patching on the resumed path
(probe/interventions/resumed.py) applies the hook path's patch function (probe/interventions/
edits.py `patch_hook`) to the window it resumes from, the boundary's stream, rather than at a hook
point (tests hold it equal to the hooked patch).

`attn_activation = "relu"` replaces the attention softmax by Wu et al. 2024's normalised ReLU
(Def. 7: sigma(<q, k>) / n), causal: token i weights key j <= i by ReLU(q_i . k_j / sqrt(hs)) / (i + 1),
the number of keys it sees. The 1/sqrt(hs) scale is GPT-2's (a reparametrisation of Def. 7's Q).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import ConfigError
from ..data.positions import x_positions
from .base import ModelOutput, ReadInOutModel
from .config import FAMILIES, ModelConfig
from .encoding import interleave
from .hooked import Hooked, HookFn, HookPoint
from .linear import StableLinear, stable_addmm

LN_EPS = 1e-5

KeyValues = list[tuple[Tensor, Tensor]]  # per block: keys, values (B, H, T, hs)


def attention_weights(parts: list[tuple[Tensor, Tensor]], activation: str) -> Tensor:
    """Attention weights over keys given in parts [(scores (..., Tq, Tk), visible (bool, broadcastable))],
    concatenated along the keys: softmax over the visible keys (GPT-2), or ReLU(score) divided by the
    number of visible keys (Wu et al. 2024, Def. 7)."""
    if activation == "softmax":
        return torch.softmax(torch.cat([s.masked_fill(~m, float("-inf")) for s, m in parts], dim=-1), dim=-1)
    weights = torch.cat([torch.relu(s).masked_fill(~m, 0.0) for s, m in parts], dim=-1)
    seen = torch.stack(
        torch.broadcast_tensors(*(m.expand(*m.shape[:-1], s.shape[-1]).sum(-1, keepdim=True) for s, m in parts))
    )
    return weights / seen.sum(0).clamp_min(1)


def _heads_last(t: Tensor) -> Tensor:
    """(..., H, T, hs) <-> (..., T, H, hs): our head-major layout and TransformerLens's."""
    return t.transpose(-2, -3)


def _fire(point: HookPoint, t: Tensor) -> Tensor:
    """A head-major tensor through a hook point that sees TransformerLens's (..., T, H, hs) layout."""
    return _heads_last(point(_heads_last(t))) if point.active else t


def _shared(a: Tensor, b: Tensor) -> Tensor:
    """a @ b where a (R, B, H, W, i) holds R copies of a window and b (B, H, i, j) is shared by them:
    the copies become rows of one (B, H) batch, so b is never broadcast (torch.matmul would copy b
    R times). Returns (R, B, H, W, j); a without the copy axis is a plain matmul."""
    if a.dim() == b.dim():
        return a @ b
    r, *batch, w, i = a.shape
    rows = a.permute(1, 2, 0, 3, 4).reshape(*batch, r * w, i)  # (B, H, R*W, i)
    return (rows @ b).view(*batch, r, w, b.shape[-1]).permute(2, 0, 1, 3, 4)


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 linear layer: y = x @ W + b with W stored as (in, out)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return stable_addmm(self.bias, x, self.weight)  # rows independent of the batch (models/linear.py)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm with TransformerLens's `hook_normalized`: the normalised stream before the
    weight and bias (what a TransformerBridge's LayerNorm gives at that name)."""

    def __init__(self, width: int):
        super().__init__(width, eps=LN_EPS)
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if not self.hook_normalized.active:
            return super().forward(x)
        normalized = self.hook_normalized(F.layer_norm(x, self.normalized_shape, eps=self.eps))
        return normalized * self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, activation: str = "softmax"):
        super().__init__()
        self.n_head = n_head
        self.activation = activation
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()  # (B, T, H, hs)
        self.hook_attn_scores = HookPoint()  # (B, H, T, T): q.k / sqrt(hs), keys not seen -inf
        self.hook_pattern = HookPoint()  # (B, H, T, T): the attention weights
        self.hook_z = HookPoint()  # (B, T, H, hs): each head's output before the output projection

    def split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values (..., H, T, hs) of the (normalised) stream x (..., T, D)."""
        width = x.shape[-1]
        q, k, v = (z.unflatten(-1, (self.n_head, width // self.n_head)) for z in self.c_attn(x).split(width, dim=-1))
        return (
            _heads_last(self.hook_q(q)),
            _heads_last(self.hook_k(k)),
            _heads_last(self.hook_v(v)),
        )

    def forward(
        self,
        x: Tensor,
        past: tuple[Tensor, Tensor] | None = None,
        visible: Tensor | None = None,
        rows: int | None = None,
    ) -> Tensor:
        """Attention output for the window x (..., W, D) (its last `rows` tokens only, if given).

        Window token i sees window tokens j <= i and the P tokens before the window whose keys and
        values are `past` (B, H, P, hs); visible (R, P) says which of those copy r of a window
        (R, B, W, D) sees (default all)."""
        q, k, v = self.split(x)  # (..., H, W, hs)
        if rows is not None:
            q = q[..., -rows:, :]
        explicit = self.hook_attn_scores.active or self.hook_pattern.active
        if past is None and rows is None and self.activation == "softmax" and not explicit:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # softmax(q k^T / sqrt(hs)) v
        else:
            z = self._attend(q, k, v, past, visible)
        return self.c_proj(_heads_last(_fire(self.hook_z, z)).flatten(-2))

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, past: tuple[Tensor, Tensor] | None, visible: Tensor | None
    ) -> Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        rows, width = q.shape[-2], k.shape[-2]
        causal = torch.ones(width, width, dtype=torch.bool, device=q.device).tril()[width - rows :]  # (rows, W)
        parts = [(q @ k.transpose(-1, -2) * scale, causal)]
        if past is not None:
            seen = torch.ones(1, dtype=torch.bool, device=q.device) if visible is None else visible
            if seen.dim() == 2:  # (R, P) -> (R, 1, 1, 1, P) against scores (R, B, H, rows, P)
                seen = seen.view(seen.shape[0], *([1] * (q.dim() - 2)), seen.shape[1])
            parts.insert(0, (_shared(q, past[0].transpose(-1, -2)) * scale, seen))
        if self.hook_attn_scores.active:  # every key's score in one tensor, invisible ones -inf
            scores = self.hook_attn_scores(torch.cat([s.masked_fill(~m, float("-inf")) for s, m in parts], dim=-1))
            parts = [(scores, scores > float("-inf"))]
        weights = self.hook_pattern(attention_weights(parts, self.activation))
        if past is None:
            return weights @ v
        p = past[0].shape[-2]
        return _shared(weights[..., :p], past[1]) + weights[..., p:] @ v


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.c_proj = Conv1D(4 * n_embd, n_embd)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.hook_post(F.gelu(self.hook_pre(self.c_fc(x)), approximate="tanh")))  # gelu_new


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, activation: str = "softmax"):
        super().__init__()  # modules in forward order (the order hook names are listed in)
        self.hook_resid_pre = HookPoint()
        self.ln_1 = LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head, activation)
        self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint()
        self.ln_2 = LayerNorm(n_embd)
        self.mlp = MLP(n_embd)
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        past: tuple[Tensor, Tensor] | None = None,
        visible: Tensor | None = None,
        rows: int | None = None,
    ) -> Tensor:
        x = self.hook_resid_pre(x)
        a = self.hook_attn_out(self.attn(self.ln_1(x), past, visible, rows))
        x = self.hook_resid_mid((x if rows is None else x[..., -rows:, :]) + a)
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln_2(x))))


class Backbone(nn.Module):
    """GPT2Model without the token embedding (inputs are embeddings)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wpe = nn.Embedding(2 * cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg.n_embd, cfg.n_head, cfg.attn_activation) for _ in range(cfg.n_layer))
        self.ln_f = LayerNorm(cfg.n_embd)


# our attribute paths -> TransformerLens's hook names
TL_NAMES = (("_backbone.h.", "blocks."), ("_backbone.ln_f.", "ln_final."), ("ln_1.", "ln1."), ("ln_2.", "ln2."))


@FAMILIES.register("gpt2")
class GPT2ICL(Hooked, ReadInOutModel, nn.Module):
    capture_backend = "hooked"
    intervention_runner = "gpt2"
    family = "gpt2"
    attention_heads = attention_activation = garg_format = key_value_cache = True  # base.py FamilyTraits
    transformer_lens_bridge = True

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        super().check_config(cfg)
        if cfg.n_embd % cfg.n_head:
            raise ConfigError(f"model.n_embd ({cfg.n_embd}) must be divisible by model.n_head ({cfg.n_head})")

    @staticmethod
    def parameter_count(cfg: ModelConfig) -> int:
        """Parameters of the model `cfg` describes, from the config alone (probe/models/sizes.py)."""
        per_layer = 12 * cfg.n_embd**2 + 13 * cfg.n_embd
        # blocks, position embedding (2n tokens), final LayerNorm, read-in and read-out
        return cfg.n_layer * per_layer + 2 * cfg.n_positions * cfg.n_embd + (cfg.token_dim + 4) * cfg.n_embd + 1

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self._read_in = StableLinear(cfg.token_dim, cfg.n_embd)
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self._backbone = Backbone(cfg)
        self._read_out = StableLinear(cfg.n_embd, 1)
        self._init_weights()
        self.name_hook_points(TL_NAMES)

    def _init_weights(self) -> None:
        # Hugging Face GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
        nn.init.normal_(self._backbone.wpe.weight, std=0.02)
        for name, p in self._backbone.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))

    @property
    def blocks(self) -> list[Block]:
        return list(self._backbone.h)  # type: ignore[arg-type]

    @property
    def final_norm(self) -> nn.LayerNorm:
        return self._backbone.ln_f

    def embed(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Read-in of encoded tokens (..., T, token_dim) (`hook_embed`) plus the positional
        embedding of `positions` (`hook_pos_embed`; index tensor broadcastable to (..., T); None: no
        positions, as a TransformerBridge adds its own)."""
        h = self.hook_embed(self._read_in(tokens))
        if positions is None:
            return h
        pos = self._backbone.wpe.weight[positions]
        return h + (self.hook_pos_embed(pos.expand_as(h)) if self.hook_pos_embed.active else pos)

    def embed_prompts(self, xs: Tensor, ys: Tensor, positions: bool = True) -> Tensor:
        """The stream entering block 0 (B, 2n, D) for prompts xs (B, n, d), ys (B, n)."""
        n = xs.shape[1]
        tokens = interleave(xs, ys, self.config.encoding)  # (B, 2n, token_dim)
        return self.embed(tokens, torch.arange(2 * n, device=xs.device) if positions else None)

    def keys_values(self, resid: list[Tensor]) -> KeyValues:
        """Every block's keys and values (B, H, T, hs) for the streams entering it (run(...).resid)."""
        kv = [block.attn.split(block.ln_1(h)) for block, h in zip(self.blocks, resid)]
        return [(k, v) for _, k, v in kv]

    def resume(
        self,
        h: Tensor,
        start: int = 0,
        stop: int | None = None,
        past: KeyValues | None = None,
        visible: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Blocks start..stop-1 (default to the last) run on the stream h (..., W, D) entering block
        `start`: h may be a window of tokens after P cached ones, whose keys and values per block
        are `past` (shared by the window's R copies when h is (R, B, W, D); `visible` (R, P) says
        which each copy sees). `last_only`: the last block computes the window's last token only.
        Hooks attached (`hooks`) fire in the blocks run. Returns the stream after block stop-1."""
        stop = len(self.blocks) if stop is None else stop
        for i in range(start, stop):
            rows = 1 if last_only and i == stop - 1 else None
            h = self.blocks[i](h, past[i] if past else None, visible, rows)
        return h

    def lens(self, resid: Tensor) -> Tensor:
        """The model's own read-out applied to any layer's raw stream: read_out(ln_f(h))."""
        return self.readout(self.final_norm(resid))

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        """Predictions and every layer boundary's residual stream for prompts xs (B, n, d), ys (B, n)."""
        h = self.embed_prompts(xs, ys)  # (B, 2n, D)
        resid = [h]
        for block in self.blocks:
            h = block(h)
            resid.append(h)
        final = self.final_norm(h)
        pred = self.readout(final[:, x_positions(xs.shape[1])])  # (B, n)
        return ModelOutput(pred=pred, resid=resid, final=final)

    def run_with_hooks(self, xs: Tensor, ys: Tensor, fwd_hooks: list[tuple[str, HookFn]]) -> ModelOutput:
        """`run` with (TransformerLens hook name, fn(value, hook)) pairs attached for this call."""
        with self.hooks(fwd_hooks):
            return self.run(xs, ys)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred
