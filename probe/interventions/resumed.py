"""Residual-stream patching of a GPT-2 family model without re-running what the patch cannot change.

Patching the residual stream at boundary l and token p leaves every block below l untouched,
and (causal attention) every token before p untouched at every layer. So a patched run is the
target run's blocks l..L-1 resumed (`GPT2ICL.resume`, the model's own forward with a key/value
cache) on a window of tokens w_0..w_end that contains p, the tokens before w_0 entering only
through their keys and values, which are the unpatched run's. Two uses:

- `patched_resid_predictions`: the patching heatmap. Patching token p resumes tokens p..query,
  with the source stream at p and the target's after it: the window is edited by the hook path's
  own patch function (probe/interventions/edits.py `patch_hook`).
- `context_patch_predictions`: iteration-consistent patching. Every token before the query
  x_{t+1} comes from the source run, so at every layer above l those tokens *are* the source
  run's; only the query token (clean at boundary l) is recomputed, one token per (t, prompt).

Both equal the TransformerLens-hook path of probe/interventions/patch.py to float round-off
(tested); other model families and sites take that path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..data.positions import keys_before
from ..models.gpt2 import KeyValues
from .edits import patch_hook


@torch.no_grad()
def streams_and_keys(model, xs: Tensor, ys: Tensor) -> tuple[list[Tensor], KeyValues]:
    """The residual stream at every boundary 0..L (B, T, D) and every block's keys and values."""
    resid = model.run(xs, ys).resid
    return resid, model.keys_values(resid)


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
            # tokens p..2 query of the target run, token p from the source: the hook path's patch
            # (runner.Runner.patched) applied to the window the blocks above resume on
            first = torch.zeros(2 * query + 1 - p, 1, dtype=torch.bool, device=xs.device)
            first[0] = True
            _, patch = patch_hook(f"resid at boundary {boundary}", first, source[boundary][:, p : 2 * query + 1])
            window = patch(target[boundary][:, p : 2 * query + 1], None)
            prefix = [(k[..., :p, :], v[..., :p, :]) for k, v in target_kv]
            final = model.resume(window.unsqueeze(0), boundary, past=prefix, last_only=True)
            preds.append(model.lens(final[0, :, -1]))
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
    visible = keys_before(queries, 2 * n)  # (T, 2n)
    out = {}
    for boundary in boundaries:
        window = clean[boundary][:, queries].transpose(0, 1).unsqueeze(2)  # (T, B, 1, D)
        final = model.resume(window, boundary, past=source_kv, visible=visible, last_only=True)
        out[boundary] = model.lens(final[:, :, 0]).T
    return out
