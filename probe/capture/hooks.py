"""The one place that owns activation names (TransformerLens's naming scheme).

Layer boundaries are numbered 0..L: boundary 0 is the embedding output (read-in + positions,
= `blocks.0.hook_resid_pre`), boundary l >= 1 is the raw residual stream after block l
(`blocks.{l-1}.hook_resid_post`), before any final LayerNorm. The stream the read-out sees
is READOUT ("final"): ln_f(h_L) after the LayerNorm's weight and bias, Hugging Face's
`hidden_states[L]`. FINAL (`ln_final.hook_normalized`) means what TransformerLens means by it:
the normalised stream *before* ln_f's weight and bias; it equals READOUT only when ln_f is the
identity affine map (a freshly initialised model).
"""

from __future__ import annotations

FINAL = "ln_final.hook_normalized"  # TransformerLens: (h - mean) / std, before ln_f's affine map
READOUT = "final"  # the stream the read-out sees: ln_f(h_L), Hugging Face's hidden_states[L]


def resid(boundary: int) -> str:
    """Hook name of layer boundary `boundary` (0 = embeddings, l = after block l)."""
    return "blocks.0.hook_resid_pre" if boundary == 0 else f"blocks.{boundary - 1}.hook_resid_post"


def resid_names(n_layers: int) -> list[str]:
    return [resid(b) for b in range(n_layers + 1)]


def attn_pattern(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def attn_site(layer: int, name: str) -> str:
    """Block `layer`'s queries, keys or values (name "q", "k", "v"), (..., T, heads, d_head)."""
    return f"blocks.{layer}.attn.hook_{name}"


def resid_pre(layer: int) -> str:
    """Block `layer`'s input (the same tensor as boundary `layer`)."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_post(layer: int) -> str:
    """Block `layer`'s output (boundary `layer + 1`)."""
    return f"blocks.{layer}.hook_resid_post"


def head_outputs(layer: int) -> str:
    """Per-head attention outputs z (..., heads, d_head) of block `layer`, before the output projection."""
    return f"blocks.{layer}.attn.hook_z"


def block_output(layer: int, part: str) -> str:
    """What block `layer`'s attention ("attn_out") or MLP ("mlp_out") adds to the residual stream."""
    return f"blocks.{layer}.hook_{part}"
