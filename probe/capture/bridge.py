"""Garg-layout GPT-2 models as TransformerLens 4.x `TransformerBridge`s, for users' TransformerLens
workflows (`probe.to_bridge`); the toolkit itself runs the model's own hooked forward
(probe/models/gpt2.py), and tests hold the two equal at every hook point (tests/test_hooked.py).

TransformerLens 4.x has no GPT-2 converter, so the weights are mapped here (REFERENCE.md §4):
Hugging Face Conv1D weights are [in, out] and become nn.Linear [out, in]; `c_attn` splits
into q, k, v. The read-out Linear(D, 1) becomes the unembedding (d_vocab = 1), so the bridge's
logits at the x tokens are the model's predictions. The read-in stays outside: the bridge is
fed input embeddings (a float tensor), to which it adds the positional embedding itself.

TransformerLens has softmax attention only: a ReLU-attention model (`attn_activation = "relu"`,
probe/models/gpt2.py) gets permanent hooks that replace each block's `hook_pattern` by
ReLU(q.k / sqrt(hs)) / (i + 1) from the same forward's `hook_q` and `hook_k`. The pattern is
applied before the value product, so every hook after it (and `run_with_cache`) sees the model's
real attention.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from ..models.gpt2 import GPT2ICL, LN_EPS, attention_weights
from . import hooks as H


def bridge_config(model: GPT2ICL):
    from transformer_lens import TransformerBridgeConfig

    c = model.config
    return TransformerBridgeConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=4 * c.n_embd,
        n_ctx=2 * c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        d_vocab=1,
        d_vocab_out=1,
        eps=LN_EPS,
        seed=0,
        model_name="icl-probe-gpt2",
    )


def bridge_state_dict(model: GPT2ICL) -> dict[str, Tensor]:
    """Our (Hugging Face-named) GPT-2 weights under TransformerLens-native names."""
    sd = model.state_dict()
    d = model.config.n_embd
    out = {
        "embed.weight": torch.zeros(1, d),
        "pos_embed.weight": sd["_backbone.wpe.weight"],
        "ln_final.weight": sd["_backbone.ln_f.weight"],
        "ln_final.bias": sd["_backbone.ln_f.bias"],
        "unembed.weight": sd["_read_out.weight"],
        "unembed.bias": sd["_read_out.bias"],
    }
    for i in range(model.config.n_layer):
        h, b = f"_backbone.h.{i}.", f"blocks.{i}."
        w_qkv, b_qkv = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]  # (D, 3D), (3D,)
        for j, name in enumerate("qkv"):
            out[b + f"attn.{name}.weight"] = w_qkv[:, j * d : (j + 1) * d].T
            out[b + f"attn.{name}.bias"] = b_qkv[j * d : (j + 1) * d]
        out[b + "attn.o.weight"] = sd[h + "attn.c_proj.weight"].T
        out[b + "attn.o.bias"] = sd[h + "attn.c_proj.bias"]
        out[b + "mlp.in.weight"] = sd[h + "mlp.c_fc.weight"].T
        out[b + "mlp.in.bias"] = sd[h + "mlp.c_fc.bias"]
        out[b + "mlp.out.weight"] = sd[h + "mlp.c_proj.weight"].T
        out[b + "mlp.out.bias"] = sd[h + "mlp.c_proj.bias"]
        for ours, theirs in (("ln_1", "ln1"), ("ln_2", "ln2")):
            out[b + f"{theirs}.weight"] = sd[h + f"{ours}.weight"]
            out[b + f"{theirs}.bias"] = sd[h + f"{ours}.bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def to_bridge(model: GPT2ICL, device: str = "cpu"):
    """A TransformerBridge computing exactly `model`'s backbone and read-out."""
    from transformer_lens import TransformerBridge

    bridge = TransformerBridge.boot_native(bridge_config(model), device=device)
    bridge.load_state_dict(bridge_state_dict(model), strict=True)
    if model.config.attn_activation != "softmax":
        _add_pattern_hooks(bridge, model.config.n_layer, model.config.attn_activation)
    return bridge.eval()


def _add_pattern_hooks(bridge, n_layers: int, activation: str) -> None:
    """Permanent hooks making the bridge's attention `activation` instead of softmax."""
    seen: dict[str, Tensor] = {}

    def keep(value: Tensor, hook, key: str) -> None:
        seen[key] = value  # (B, T, H, hs)

    def pattern(value: Tensor, hook, layer: int) -> Tensor:
        q, k = seen.pop(f"q{layer}"), seen.pop(f"k{layer}")
        scores = torch.einsum("bihe,bjhe->bhij", q, k) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        t = scores.shape[-1]
        causal = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
        return attention_weights([(scores, causal)], activation).to(value.dtype)

    for layer in range(n_layers):
        bridge.add_hook(H.attn_site(layer, "q"), partial(keep, key=f"q{layer}"), is_permanent=True)
        bridge.add_hook(H.attn_site(layer, "k"), partial(keep, key=f"k{layer}"), is_permanent=True)
        bridge.add_hook(H.attn_pattern(layer), partial(pattern, layer=layer), is_permanent=True)


def bridge_inputs(model: GPT2ICL, xs: Tensor, ys: Tensor) -> Tensor:
    """The float input embeddings the bridge is fed: read-in of the token sequence (no positions)."""
    return model.embed_prompts(xs, ys, positions=False)
