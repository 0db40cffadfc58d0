"""Run planted models (probe/models/planted.py) as TransformerLens bridges.

TransformerLens has softmax attention only, so the bridge is a LayerNorm-free, bidirectional
TransformerBridge whose attention patterns are replaced, through its own `hook_pattern` hooks, by
the planted weights: linear <K h_i, Q h_j>, or ReLU(<K h_i, Q h_j>) for the ReLU-attention
construction (scaled by 1/t where the construction says so), computed from the layer input caught
at `hook_resid_pre`. One more head with an identity pattern carries the skip map. Values, output
projections and the ReLU MLP (ReLU construction only; attention-only otherwise) are ordinary
bridge weights, so every TransformerLens hook name is available. Each prefix run is one bridge
sequence (batch = prompts x prefixes), exactly as PlantedICL.run lays them out.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch import Tensor

from ..models.base import ModelOutput
from ..models.planted import PlantedICL
from . import hooks as H
from .bridge import weights_state


def planted_bridge(model: PlantedICL, n_tokens: int, device: str = "cpu"):
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    w, layers, heads = model.layout.width, model.config.n_layer, model.q.shape[1]
    cfg = TransformerBridgeConfig(
        n_layers=layers,
        d_model=w,
        n_heads=heads + 1,
        d_head=w,
        d_mlp=max(model.d_mlp, 1),
        n_ctx=n_tokens,
        act_fn="relu",
        normalization_type=None,
        positional_embedding_type="standard",
        d_vocab=1,
        d_vocab_out=1,
        seed=0,
        attn_only=not model.d_mlp,
        attention_dir="bidirectional",
        model_name="icl-probe-planted",
    )
    bridge = TransformerBridge.boot_native(cfg, device=device)
    sd = {k: torch.zeros_like(v) for k, v in bridge.state_dict().items()}
    eye = torch.eye(w)
    for l in range(layers):
        values = [*model.v[l], model.skip[l]]  # the skip map rides on an identity-pattern last head
        sd[f"blocks.{l}.attn.v.weight"] = torch.cat([v.float() for v in values], dim=0)  # ((heads + 1) W, W)
        sd[f"blocks.{l}.attn.o.weight"] = torch.cat([eye] * (heads + 1), dim=1)  # sum of the heads
        if model.d_mlp:
            sd[f"blocks.{l}.mlp.in.weight"] = model.mlp_in[l].float()
            sd[f"blocks.{l}.mlp.out.weight"] = model.mlp_out[l].float()
    sd["unembed.weight"] = model.read.detach().float().view(1, w)
    bridge.load_state_dict(sd, strict=True)
    return bridge.eval()


_BRIDGES: weakref.WeakKeyDictionary[PlantedICL, dict] = weakref.WeakKeyDictionary()


def cached_planted_bridge(model: PlantedICL, n_tokens: int, device: str = "cpu"):
    """`planted_bridge`, built once per model object, sequence length, device and state of its
    weights (bridge.weights_state: weights edited in place give a fresh bridge)."""
    store = _BRIDGES.setdefault(model, {})
    key = (n_tokens, str(device), weights_state(model))
    if key not in store:
        store[key] = planted_bridge(model, n_tokens, device)
    return store[key]


def run_through_bridge(
    model: PlantedICL,
    xs: Tensor,
    ys: Tensor,
    extra_hooks: dict[str, object] | None = None,
    device: str = "cpu",
    fwd_hooks: list | None = None,
    runs: list[int] | None = None,
) -> tuple[ModelOutput, dict[str, Tensor]]:
    """PlantedICL.run computed by the TransformerLens bridge; also returns the named hooks asked
    for in `extra_hooks` (name -> None), each (B, n, ...) with one entry per prefix run.

    fwd_hooks: TransformerLens hooks (name, fn) that may edit activations (interventions); they
    see the bridge's layout (B * n runs, T tokens, ...) and run before this function's own hooks
    at the same point, so the states it returns are the edited ones.

    runs: run only these prefix runs (run t predicts y_{t+1}; len(runs) bridge sequences per prompt
    instead of n); `pred` is then (B, len(runs)) and the residual streams hold 0 at the tokens read
    from other runs (PlantedICL.interleave_runs). Named hooks have one entry per run computed."""
    b, n_all, _ = xs.shape
    tokens, t = model.tokens(xs.float(), ys.float())  # (B, n, T, W)
    if runs is not None:
        tokens, t = tokens[:, runs], t[runs]
    n = tokens.shape[1]
    seq = tokens.reshape(b * n, tokens.shape[2], -1).to(device)
    scale = torch.where(t > 0, 1 / t.clamp_min(1), torch.zeros_like(t)).repeat(b).to(device)  # run index = b*n + t
    bridge = cached_planted_bridge(model, seq.shape[1], device)
    layer_in: dict[int, Tensor] = {}
    states: dict[int, Tensor] = {}
    caught: dict[str, Tensor] = {}

    def keep_input(value: Tensor, hook, layer: int) -> None:
        layer_in[layer] = value

    def keep_output(value: Tensor, hook, layer: int) -> None:
        states[layer] = value

    def keep_named(value: Tensor, hook, name: str) -> None:
        caught[name] = value.detach()

    hooks = list(fwd_hooks or [])
    for l in range(model.config.n_layer):
        hooks += [
            (H.resid_pre(l), partial(keep_input, layer=l)),
            (H.attn_pattern(l), partial(_planted_pattern, model=model, scale=scale, layer_in=layer_in, layer=l)),
            (H.resid_post(l), partial(keep_output, layer=l)),
        ]
    for name in extra_hooks or {}:
        hooks.append((name, partial(keep_named, name=name)))
    with torch.no_grad():
        bridge.run_with_hooks(seq, fwd_hooks=hooks)
    named = {k: v.reshape(b, n, *v.shape[1:]) for k, v in caught.items()}
    boundaries = [seq] + [states[l] for l in range(model.config.n_layer)]
    resid = [model.interleave_runs(r.view(b, n, *r.shape[1:]), runs, n_all) for r in boundaries]
    pred = model.readout(boundaries[-1].view(b, n, *seq.shape[1:])[:, :, -1])  # each run's query token
    return ModelOutput(pred=pred, resid=resid, final=resid[-1]), named


def _planted_pattern(
    pattern: Tensor, hook, model: PlantedICL, scale: Tensor, layer_in: dict[int, Tensor], layer: int
) -> Tensor:
    """The bridge's attention pattern replaced by the planted one (probe/models/planted.py): each
    head's scores sigma(<K h_i, Q h_j>) of the layer's input, times 1/t for per-example heads,
    and the identity for the skip head."""
    h = layer_in[layer]
    out = torch.zeros_like(pattern)
    for head in range(model.q.shape[1]):
        q, k = h @ model.q[layer, head].float().T, h @ model.k[layer, head].float().T
        scores = model.scores(q, k)  # [j, i] = sigma(<K h_i, Q h_j>)
        out[:, head] = scores * (scale.view(-1, 1, 1) if model.per_example[layer, head] else 1.0)
    out[:, -1] = torch.eye(pattern.shape[-1], device=pattern.device)  # the skip head
    return out
