"""The one place that owns activation names (TransformerLens's naming scheme).

Layer boundaries are numbered 0..L: boundary 0 is the embedding output (read-in + positions,
= `blocks.0.hook_resid_pre`), boundary l >= 1 is the raw residual stream after block l
(`blocks.{l-1}.hook_resid_post`), before any final LayerNorm. The stream the read-out sees
is `ln_final.hook_normalized` ("final" in this toolkit) and is a different tensor.
"""

from __future__ import annotations

FINAL = "ln_final.hook_normalized"


def resid(boundary: int) -> str:
    """Hook name of layer boundary `boundary` (0 = embeddings, l = after block l)."""
    return "blocks.0.hook_resid_pre" if boundary == 0 else f"blocks.{boundary - 1}.hook_resid_post"


def resid_names(n_layers: int) -> list[str]:
    return [resid(b) for b in range(n_layers + 1)]


def attn_pattern(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"
