"""Residual-stream patching of a GPT-2 family model without re-running what the patch cannot change.

Patching the residual stream at boundary l and token p leaves every block below l untouched,
and (causal attention) every token before p untouched at every layer. So a patched run is the
target run's blocks l..L-1 resumed on a window of tokens w_0..w_end that contains p, the tokens
before w_0 entering only through their keys and values, which are the unpatched run's:

    attention row of window token i at block j = softmax([q_i k_m / sqrt(h)]_{m < w_0, visible}
                                                        + [q_i k_v / sqrt(h)]_{w_0 <= v <= i}) V

(GPT-2's attention, Radford et al. 2019, split into a cached part and a recomputed part, as
probe/analysis/states.py does for fresh queries). Two uses:

- `patched_resid_predictions`: the patching heatmap. Patching token p resumes tokens p..query,
  with the source stream at p and the target's after it.
- `context_patch_predictions`: iteration-consistent patching. Every token before the query
  x_{t+1} comes from the source run, so at every layer above l those tokens *are* the source
  run's; only the query token (clean at boundary l) is recomputed, one token per (t, prompt).

Both equal the TransformerLens-hook path of probe/interventions/patch.py to float round-off
(tested); other model families and sites take that path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..positions import X_TOKENS

KeyValues = list[tuple[Tensor, Tensor]]  # per block: keys, values (B, H, T, hs)


@torch.no_grad()
def streams_and_keys(model, xs: Tensor, ys: Tensor) -> tuple[list[Tensor], KeyValues]:
    """The residual stream at every boundary 0..L (B, T, D) and every block's keys and values."""
    out = model.run(xs, ys)
    keys_values = [_split(block, h)[1:] for block, h in zip(model._backbone.h, out.resid)]
    return out.resid, keys_values


def _split(block, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A block's queries, keys and values (..., H, T, hs) for the stream entering it (..., T, D)."""
    width, heads = h.shape[-1], block.attn.n_head
    qkv = block.attn.c_attn(block.ln_1(h))
    return tuple(z.unflatten(-1, (heads, width // heads)).transpose(-2, -3) for z in qkv.split(width, dim=-1))


def resume(
    model, boundary: int, window: Tensor, prefix: KeyValues, visible: Tensor | None = None, last_only: bool = False
) -> Tensor:
    """Blocks boundary..L-1 run on window tokens (R, B, W, D) that follow cached tokens.

    prefix[j]: block j's keys and values (B, H, P, hs) of the P tokens before the window, shared
    by the R copies; visible (R, P) says which of them copy r attends to (default all). Returns
    the final residual stream of the window (R, B, W, D), or of its last token only (R, B, 1, D)
    with `last_only` (the last block then runs that token alone)."""
    h = window
    w = h.shape[-2]
    causal = torch.ones(w, w, dtype=torch.bool, device=h.device).tril()
    blocks = list(zip(model._backbone.h, prefix))[boundary:]
    for i, (block, (k_pre, v_pre)) in enumerate(blocks):
        q, k, v = _split(block, h)  # (R, B, H, W, hs)
        if last_only and i == len(blocks) - 1:
            q, h, causal = q[..., -1:, :], h[..., -1:, :], causal[-1:]
        scale = 1.0 / math.sqrt(q.shape[-1])
        s_pre = torch.einsum("rbhie,bhme->rbhim", q, k_pre) * scale
        if visible is not None:
            s_pre = s_pre.masked_fill(~visible[:, None, None, None, :], float("-inf"))
        s_win = (q @ k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
        weights = torch.softmax(torch.cat([s_pre, s_win], dim=-1), dim=-1)
        p = k_pre.shape[-2]
        mixed = torch.einsum("rbhim,bhme->rbhie", weights[..., :p], v_pre) + weights[..., p:] @ v
        h = h + block.attn.c_proj(mixed.transpose(-2, -3).flatten(-2))
        h = h + block.mlp(block.ln_2(h))
    return h if not last_only else h[..., -1:, :]


def _read(model, final: Tensor) -> Tensor:
    return model.readout(model._backbone.ln_f(final))


@torch.no_grad()
def patched_resid_predictions(
    model, xs: Tensor, ys_target: Tensor, ys_source: Tensor, boundaries: list[int], positions: list[int], query: int
) -> dict[int, Tensor]:
    """boundary -> (K, B) predictions for y_{query+1} of the target run with the source run's
    stream at `boundary` patched in at positions[k] (interleaved index <= 2 query) only. Each
    position p resumes the tokens p..2 query alone, after the target's cached keys and values."""
    xs, ys_target, ys_source = xs[:, : query + 1], ys_target[:, : query + 1], ys_source[:, : query + 1]
    target, target_kv = streams_and_keys(model, xs, ys_target)
    source, _ = streams_and_keys(model, xs, ys_source)
    out = {}
    for boundary in boundaries:
        preds = []
        for p in positions:
            window = target[boundary][:, p : 2 * query + 1].clone()  # (B, W, D): tokens p..2 query
            window[:, 0] = source[boundary][:, p]
            prefix = [(k[..., :p, :], v[..., :p, :]) for k, v in target_kv]
            final = resume(model, boundary, window.unsqueeze(0), prefix, last_only=True)
            preds.append(_read(model, final[0, :, -1]))
        out[boundary] = torch.stack(preds)
    return out


@torch.no_grad()
def context_patch_predictions(
    model, xs: Tensor, ys: Tensor, ys_source: Tensor, boundaries: list[int], examples: list[int]
) -> dict[int, Tensor]:
    """boundary -> (B, T) predictions for y_{t+1}, t in `examples`, of the clean run (X, y) with
    every token before the query x_{t+1} taken from the source run (X, y') at `boundary`."""
    clean, _ = streams_and_keys(model, xs, ys)
    _, source_kv = streams_and_keys(model, xs, ys_source)
    n = xs.shape[1]
    ts = torch.tensor(examples, device=xs.device)
    queries = 2 * ts  # interleaved positions of x_{t+1}
    visible = torch.arange(2 * n, device=xs.device)[None, :] < 2 * ts[:, None]  # (T, 2n)
    out = {}
    for boundary in boundaries:
        window = clean[boundary][:, queries].transpose(0, 1).unsqueeze(2)  # (T, B, 1, D)
        final = resume(model, boundary, window, source_kv, visible, last_only=True)
        out[boundary] = _read(model, final[:, :, 0]).T
    return out


@torch.no_grad()
def ablated_predictions(model, xs: Tensor, ys: Tensor, components: list, means: dict[str, Tensor]) -> list[Tensor]:
    """Predictions (B, n) with each component removed (probe/interventions/ablate.py's kinds),
    each resumed from the boundary below the component's block after one unablated run.

    components: objects with .component ("none", "head", "mlp", "layer"), .layer, .head, .kind;
    means: the mean-ablation values in TransformerLens layouts, keyed by hook name (hook_z
    (1, T, H, hs), hook_mlp_out (1, T, D)), as `ablate` computes them."""
    from ..capture import hooks as H

    streams = model.run(xs, ys).resid
    out = []
    for c in components:
        if c.kind == "none":
            out.append(_read(model, streams[-1][:, X_TOKENS]))
            continue
        block, h = model._backbone.h[c.layer], streams[c.layer]
        if c.kind != "skip":  # "layer" + "skip": boundary layer + 1 := boundary layer
            site = H.head_outputs(c.layer) if c.component == "head" else H.block_output(c.layer, "mlp_out")
            mean = means.get(site) if c.kind == "mean" else None
            h = h + _attention(block, h, c.head if c.component == "head" else None, mean)
            mlp = block.mlp(block.ln_2(h))
            if c.component == "mlp":
                mlp = torch.zeros_like(mlp) if mean is None else mean.expand_as(mlp)
            h = h + mlp
        for later in model._backbone.h[c.layer + 1 :]:
            h = later(h)
        out.append(_read(model, h[:, X_TOKENS]))
    return out


def _attention(block, h: Tensor, head: int | None, mean: Tensor | None) -> Tensor:
    """A block's attention output, with head `head`'s z zeroed (or set to mean (1, T, H, hs))."""
    q, k, v = _split(block, h)  # (B, H, T, hs)
    z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    if head is not None:
        z = z.clone()
        z[:, head] = 0.0 if mean is None else mean[:, :, head].expand(z.shape[0], -1, -1)
    return block.attn.c_proj(z.transpose(1, 2).flatten(-2))
