"""Layer-by-layer views of a model: hidden states at the x tokens, and states for fresh queries.

Boundary l = 0..L follows probe.capture.hooks: 0 is the embedding output, l the raw residual
stream after block (or LSTM layer) l. Layer predictors are these states passed through a
retrained read-out (probe.analysis.readout).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ..capture import RESID, capture
from ..core.memory import MemoryBudget, nbytes
from ..core.progress import tqdm
from ..data.positions import X_TOKENS, keys_before
from ..models.encoding import interleave
from ..models.sizes import FORWARD_BATCH_BYTES

LayerReadout = Callable[[int, np.ndarray], np.ndarray]  # (layer, states (..., D)) -> predictions (...)


def x_states(
    model,
    xs: Tensor,
    ys: Tensor,
    device: str = "cpu",
    batch_size: int = 256,
    progress: bool = False,
    memory: MemoryBudget | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states at the x tokens (L+1, B, n, D) and the model's predictions (B, n)."""
    cap = capture(
        model,
        xs,
        ys,
        hooks=[RESID],
        positions="x",
        device=device,
        batch_size=batch_size,
        progress=progress,
        memory=memory,
    )
    return np.asarray(cap.acts[RESID]), cap.pred


def query_states(
    model,
    xs: Tensor,
    ys: Tensor,
    queries: Tensor,
    device: str = "cpu",
    batch_size: int = 512,
    progress: bool = False,
    start: int = 0,
    max_bytes: int | None = None,
    readout: LayerReadout | None = None,
    memory: MemoryBudget | None = None,
    per_prefix: bool = False,
) -> np.ndarray:
    """States (L+1, B, n - start, Q, D) of query x~_q placed right after the first t examples,
    for t = start..n-1; with `readout`, its predictions (L+1, B, n - start, Q) instead, taken
    chunk by chunk so the states (Q times a capture's size) are never held at once. With
    `per_prefix`, queries (B, n, d) hold one query per prefix, the t-th after t examples (Q = 1;
    the key/value cache path only).

    For each prefix t the model sees x_1, y_1, ..., x_t, y_t, x~_q; causality makes this exactly
    the model's state when predicting for x~_q after t examples (Fu et al. 2024, eq. 11). Families that
    declare a key/value cache (`FamilyTraits.key_value_cache`: GPT-2) take the cache path
    (`cached_query_states`: each prompt runs once); others run every prefix and query as its own
    sequence.
    """
    if getattr(model, "key_value_cache", False):
        return cached_query_states(
            model, xs, ys, queries, device, progress, start, max_bytes, readout, memory, per_prefix
        )
    if per_prefix:
        raise ValueError("one query per prefix needs a model with a key/value cache (FamilyTraits.key_value_cache)")
    return sequence_query_states(model, xs, ys, queries, device, batch_size, progress, start, readout, memory)


def query_predictions(
    model,
    xs: Tensor,
    ys: Tensor,
    queries: Tensor,
    device: str = "cpu",
    start: int = 0,
    memory: MemoryBudget | None = None,
    per_prefix: bool = False,
) -> Tensor:
    """The model's own prediction for each fresh query x~_q after t examples, t = start..n-1:
    (B, n - start, Q) float64 (Q = 1 with `per_prefix`: query t after t examples); its read-out
    (`lens`, else `readout`) on the last boundary of `query_states` (so the same cache path, memory
    budget and chunking)."""
    lens = getattr(model, "lens", None) or model.readout
    last = model.n_layers

    @torch.no_grad()
    def own(layer: int, s: np.ndarray) -> np.ndarray:
        if layer != last:
            return np.zeros(s.shape[:-1])
        at = next(iter(model.parameters()), torch.empty(0)).device
        return lens(torch.as_tensor(s).to(at)).double().cpu().numpy()

    states = query_states(
        model, xs, ys, queries, device, start=start, readout=own, memory=memory, per_prefix=per_prefix
    )
    return torch.from_numpy(np.ascontiguousarray(states[-1])).double()


def _per_layer(states: np.ndarray, readout: LayerReadout | None) -> np.ndarray:
    """states (L+1, ..., D), or their read-out (L+1, ...) layer by layer."""
    if readout is None:
        return states
    return np.stack([readout(layer, s) for layer, s in enumerate(states)])


def prefix_query_sequences(xs: Tensor, ys: Tensor, queries: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """Prompts (B * Q, t + 1, d), (B * Q, t + 1): each prompt's first t examples followed by each of
    its queries x~_q (Q per prompt; y 0 there), prompt-major."""
    b, _, d = xs.shape
    q = queries.shape[1]
    seq_x = torch.cat([xs[:, :t].unsqueeze(1).expand(b, q, t, d), queries.unsqueeze(2)], dim=2)
    seq_y = torch.cat([ys[:, :t].unsqueeze(1).expand(b, q, t), ys.new_zeros(b, q, 1)], dim=2)
    return seq_x.reshape(b * q, t + 1, d), seq_y.reshape(b * q, t + 1)


def sequence_query_states(
    model,
    xs: Tensor,
    ys: Tensor,
    queries: Tensor,
    device: str = "cpu",
    batch_size: int = 512,
    progress: bool = False,
    start: int = 0,
    readout: LayerReadout | None = None,
    memory: MemoryBudget | None = None,
) -> np.ndarray:
    """query_states by brute force: one captured sequence per prefix t and query (any model)."""
    b, n, _ = xs.shape
    q = queries.shape[1]
    out: np.ndarray | None = None

    for t in tqdm(range(start, n), desc="query states", disable=not progress, leave=False):
        seq_x, seq_y = prefix_query_sequences(xs, ys, queries, t)
        cap = capture(
            model, seq_x, seq_y, hooks=[RESID], positions=[2 * t], device=device, batch_size=batch_size, memory=memory
        )
        states = np.asarray(cap.acts[RESID])[:, :, 0]  # (L+1, B*Q, D)
        values = _per_layer(states.reshape(states.shape[0], b, q, -1), readout)
        if out is None:
            out = np.empty((values.shape[0], b, n - start, *values.shape[2:]), dtype=values.dtype)
        out[:, :, t - start] = values
    assert out is not None, "no prefixes to compute"
    return out


def _query_chunk(max_bytes: int, n: int, steps: int, q: int, width: int, heads: int) -> int:
    """Prompts per chunk of `cached_query_states` within `max_bytes`, counting 15 float32 arrays of
    the steps * q query rows' scores and MLP activations per prompt. Measured on a Garg-standard
    GPT-2 (2026-11-24): 72 MB per prompt (about 4 such arrays, the output included) since the
    copies no longer broadcast the cached keys and values (0.31 GB before); the generous count
    keeps chunks small, which measured no slower (16 prompts: 10.0 s in chunks of 2, 12.4 s of 8)."""
    per_prompt = nbytes((steps * q * (4 * width + heads * (2 * n + 1)) + 2 * n * 4 * width, 15))
    return max(1, int(max_bytes // max(per_prompt, 1)))


@torch.no_grad()
def cached_query_states(
    model,
    xs: Tensor,
    ys: Tensor,
    queries: Tensor,
    device: str = "cpu",
    progress: bool = False,
    start: int = 0,
    max_bytes: int | None = None,
    readout: LayerReadout | None = None,
    memory: MemoryBudget | None = None,
    per_prefix: bool = False,
) -> np.ndarray:
    """query_states for models with a key/value cache (`model.resume`, the GPT-2 family).

    Causal attention means tokens 1..2t of a prompt never see what follows them, so their keys
    and values at every layer are the same with or without a query appended. Each prompt runs
    once; then every query of every prefix t is one token at position 2t, resumed block by block
    after the prompt's cached keys and values, of which it sees those before 2t (Fu et al. 2024, eq. 11).
    Equal to `sequence_query_states` up to float round-off (tested to 1e-5). Prompts are
    processed in chunks sized from `max_bytes` (default: a quarter of `memory`'s headroom, at most
    FORWARD_BATCH_BYTES as for any forward; the output array and the prompt's capture hold the rest).
    """

    b, n, _ = xs.shape
    q = 1 if per_prefix else queries.shape[1]
    layers, width, heads = model.n_layers, model.d_model, model.config.n_head
    steps = n - start
    out = (
        np.empty((layers + 1, b, steps, q, width), dtype=np.float32)
        if readout is None
        else np.empty((layers + 1, b, steps, q), dtype=np.float64)
    )
    keep = (lambda layer, s: s) if readout is None else readout
    budget = (
        max_bytes if max_bytes is not None else min((memory or MemoryBudget()).headroom() // 4, FORWARD_BATCH_BYTES)
    )
    chunk = _query_chunk(budget, n, steps, q, width, heads)
    model = model.to(device).eval()
    t_idx = torch.arange(start, n, device=device)
    visible = keys_before(2 * t_idx, 2 * n)  # (steps, 2n): keys j < 2t
    visible = visible.repeat_interleave(q, dim=0)  # (steps * Q, 2n): one window copy per (t, query)
    positions = (2 * t_idx).repeat_interleave(q)[:, None, None]  # the query sits at the x position 2t

    for lo in tqdm(range(0, b, chunk), desc="query states", disable=not progress, leave=False):
        bx, by, bq = xs[lo : lo + chunk].to(device), ys[lo : lo + chunk].to(device), queries[lo : lo + chunk].to(device)
        m = bx.shape[0]
        past = model.keys_values(model.run(bx, by).resid)
        blank_ys = torch.zeros(m, bq.shape[1], device=device, dtype=bq.dtype)
        q_tokens = interleave(bq, blank_ys, model.config.encoding)[:, X_TOKENS]  # (m, Q or n, token_dim)
        if per_prefix:  # prefix t's own query
            tokens = q_tokens[:, start:].transpose(0, 1)[:, :, None]  # (steps, m, 1, token_dim)
        else:
            tokens = q_tokens.transpose(0, 1).repeat(steps, 1, 1)[:, :, None]  # (steps * Q, m, 1, token_dim)
        hq = model.embed(tokens, positions)  # (steps * Q, m, 1, D)
        for layer in range(layers + 1):
            if layer:
                hq = model.resume(hq, layer - 1, layer, past, visible)
            states = hq[:, :, 0].reshape(steps, q, m, width).permute(2, 0, 1, 3)  # (m, steps, Q, D)
            out[layer, lo : lo + m] = keep(layer, states.float().cpu().numpy())
    return out
