"""Capture activations for many prompts: one forward pass per batch, only what is asked for.

Transformers (the GPT-2 family and the planted linear-attention models) run their own forward
with TransformerLens-named hook points, so any of those names can be asked for (for planted
models a hook's value has one entry per prefix run: (B, n, ...)); other models (the LSTM, your own
protocol class) provide the layer boundaries and the final stream through `run`. Results stay in memory, or
stream into `.npy` memmaps under `out_dir` (given, or a temporary directory when the result
would exceed `max_bytes`).
"""

from __future__ import annotations

import copy
import logging
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..core.allocator import release_free_memory
from ..core.errors import ConfigError, ProbeError
from ..core.memory import MemoryBudget, nbytes
from ..core.progress import tqdm
from ..core.validate import check_device, check_prompts_for, positive_int
from ..io.outputs import clean_stale
from ..models.sizes import forward_batch
from . import hooks as H
from .backends import Request, backend_for, final_norm
from .handle import to_bridge

log = logging.getLogger(__name__)
RESID = "resid"  # shorthand: every layer boundary 0..L stacked, (L+1, B, P, D)


@dataclass
class Capture:
    pred: np.ndarray  # (B, n)
    acts: dict[str, np.ndarray] = field(default_factory=dict)  # hook name (or "resid") -> array
    positions: np.ndarray | None = None  # token positions kept (None: all 2n)

    def as_cache(self, model=None):
        """A TransformerLens `ActivationCache` keyed by TL hook names: "resid" becomes
        blocks.{l}.hook_resid_pre and blocks.{l}.hook_resid_post; other names are kept. `model`
        (a TransformerBridge, e.g. `probe.to_bridge(...)`) enables the cache's model-aware methods."""
        from transformer_lens import ActivationCache

        tensors = {name: torch.from_numpy(np.asarray(value)) for name, value in self.acts.items() if name != RESID}
        if RESID in self.acts:
            stacked = self.acts[RESID]
            for b in range(stacked.shape[0]):
                tensors[H.resid(b)] = torch.from_numpy(np.asarray(stacked[b]))
                if b < stacked.shape[0] - 1:  # the same tensor under TL's other name: block b's input
                    tensors[H.resid_pre(b)] = tensors[H.resid(b)]
        return ActivationCache(tensors, model)


SPILL_PREFIX = "icl-probe-capture-"


def spill_dir() -> str:
    """A temporary directory for memmaps, named with our pid; those of dead processes are removed."""

    clean_stale(Path(tempfile.gettempdir()), re.compile(re.escape(SPILL_PREFIX) + r"(\d+)-"))
    return tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-")


def _select(t: Tensor, positions: Tensor | None) -> Tensor:
    return t if positions is None else t[:, positions]


class _Sink:
    """Arrays filled batch by batch, in memory or as .npy memmaps."""

    def __init__(self, out_dir: Path | None, dtype: np.dtype):
        self.out_dir, self.dtype = out_dir, dtype
        self.arrays: dict[str, np.ndarray] = {}

    def put(
        self,
        name: str,
        full_shape: tuple[int, ...],
        batch_axis: int,
        start: int,
        value: np.ndarray,
        leading: int | None = None,
    ) -> None:
        """Write `value` at rows start.. of `batch_axis`; `leading` selects one entry of axis 0 (a layer)."""
        if name not in self.arrays:
            if self.out_dir is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                path = self.out_dir / f"{name.replace('/', '_')}.npy"
                self.arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=self.dtype, shape=full_shape)
            else:
                self.arrays[name] = np.empty(full_shape, dtype=self.dtype)
        index = [slice(None)] * len(full_shape)
        index[batch_axis] = slice(start, start + value.shape[batch_axis])
        if leading is not None:
            index[0] = slice(leading, leading + 1)
        self.arrays[name][tuple(index)] = value


def capture(
    model,
    xs: Tensor,
    ys: Tensor,
    hooks: Sequence[str] = (RESID,),
    positions: str | Sequence[int] = "all",
    batch_size: int = 256,
    device: str = "cpu",
    progress: bool = False,
    backend: str = "auto",
    out_dir: str | Path | None = None,
    max_bytes: int | None = None,
    as_cache: bool = False,
    double: bool = False,
    memory: MemoryBudget | None = None,
    by_position: bool = False,
):
    """Predictions and the requested activations for prompts xs (B, n, d), ys (B, n).

    hooks: "resid" (all layer boundaries, raw, before any final LayerNorm: (L+1, B, P, D)),
    "final" (the stream the read-out sees: ln_f(h_L) with ln_f's weight and bias, Hugging
    Face's hidden_states[L]), "ln_final.hook_normalized" (TransformerLens's meaning: before
    ln_f's weight and bias; the same tensor on every back-end), or any TransformerLens
    hook name for transformers (e.g. "blocks.3.attn.hook_pattern", stored (B, ...) as TL gives it).
    positions: "all" (2n tokens), "x" (the x tokens, where predictions are read) or indices. A planted
    model runs only the prefix runs those tokens are read from (unless named hooks are asked for):
    the predictions of the other runs are NaN.
    backend: "hooked" (transformers: named hook points), "native" (the model's own `run`), or "auto"
    (probe/capture/backends.py).
    as_cache: return `Capture.as_cache()` (a TransformerLens ActivationCache indexed by hook names,
    tied to a bridge of the model for the GPT-2 family) instead of the Capture.
    memory: the budget that sizes batches and decides spilling (default: MemoryBudget()).
    double: the model (a float64 copy, run by its native back-end) and the stored activations in
    float64.
    by_position: "resid" stored (L+1, P, B, D), prompts on axis 2 (the probes' layout), written so
    from each batch's streams directly.
    """
    xs, ys = check_prompts_for(model, xs, ys)
    if double:
        xs, ys = xs.double(), ys.double()
        if any(p.dtype != torch.float64 for p in model.parameters()):
            model = copy.deepcopy(model).double()  # the caller's model stays as it is
        backend = "native" if backend == "auto" else backend
    batch_size = positive_int(batch_size, "capture batch_size")
    device = check_device(device)
    hooks = [hooks] if isinstance(hooks, str) else list(hooks)
    b, n, _ = xs.shape
    model = model.to(device).eval()
    runner = backend_for(model, backend, device)
    pos = _positions(positions, n)
    request = replace(_request(model, hooks, runner), positions=None if pos is None else tuple(pos.tolist()))
    n_pos = 2 * n if pos is None else len(pos)
    memory = memory or MemoryBudget()
    out_dir, spilled = _storage(
        model, hooks, b, n_pos, out_dir, max_bytes if max_bytes is not None else memory.headroom()
    )
    if max_bytes is None:  # the batch's own forward pass must fit beside what is kept
        kept = 0 if out_dir else _stored_bytes(model, hooks, b, n_pos)
        batch_size = _batch_within_budget(model, n, batch_size, kept, memory.headroom())
    sink = _Sink(Path(out_dir) if out_dir is not None else None, np.dtype(np.float64 if double else np.float32))
    preds = np.empty((b, n), dtype=np.float32)

    with torch.no_grad():
        for start in tqdm(range(0, b, batch_size), desc="capture", disable=not progress, leave=False):
            acts = runner.run(
                xs[start : start + batch_size].to(device), ys[start : start + batch_size].to(device), request
            )
            preds[start : start + len(acts.pred)] = acts.pred.float().cpu().numpy()
            _store_batch(sink, acts, request, pos, start, (b, n_pos, model.d_model), model.n_layers, by_position)
    if pos is None and not np.isfinite(preds).all():  # every run ran: a non-finite prediction is an overflow
        scale = max(float(xs.abs().max()), float(ys.abs().max()))
        raise ProbeError(
            f"the model's predictions overflow to NaN or inf on these prompts (inputs reach |value| {scale:.3g}; "
            f"{model.__class__.__name__} computes in {next(model.parameters()).dtype}): rescale the prompts"
            + ("" if double else " or capture with double=True")
        )
    result = Capture(pred=preds, acts=sink.arrays, positions=None if pos is None else pos.numpy())
    release_free_memory()  # the batches' forward temporaries leave the resident set before the caller's next step
    if spilled:  # our own temporary directory goes when the result does (the memmaps stay readable until then)
        weakref.finalize(result, shutil.rmtree, str(out_dir), True)
    if as_cache:
        bridged = getattr(model, "transformer_lens_bridge", False)  # a family trait (models/base.py)
        return result.as_cache(_public_bridge(model, device) if bridged else None)
    return result


def _store_batch(
    sink, acts, request, pos, start: int, stream_shape: tuple[int, int, int], n_layers: int, by_position: bool = False
) -> None:
    """One batch's activations (prompts start.., positions `pos`) into the sink's arrays, whose
    whole shape is stream_shape (B, P, D) per stream, with L+1 boundaries for the residual stream
    (by_position: (L+1, P, B, D))."""
    b, p, d = stream_shape
    for boundary, stream in enumerate(acts.resid):
        value = _numpy(_select(stream, pos))[None]  # (1, b, P, D)
        if by_position:
            sink.put(RESID, (n_layers + 1, p, b, d), 2, start, value.transpose(0, 2, 1, 3), boundary)
        else:
            sink.put(RESID, (n_layers + 1, b, p, d), 1, start, value, boundary)
    if request.readout:
        sink.put(H.READOUT, stream_shape, 0, start, _numpy(_select(_present(acts.readout), pos)))
    if request.normalized:
        sink.put(H.FINAL, stream_shape, 0, start, _numpy(_select(_present(acts.normalized), pos)))
    for name, value in acts.named.items():
        sink.put(name, (stream_shape[0], *value.shape[1:]), 0, start, _numpy(value))


def _numpy(t: Tensor) -> np.ndarray:
    return (t if t.dtype == torch.float64 else t.float()).cpu().numpy()


def _present(t: Tensor | None) -> Tensor:
    if t is None:
        raise RuntimeError("the capture back-end did not return a requested stream")
    return t


def _request(model, hooks: list[str], runner) -> Request:
    """What to ask the back-end for, refusing hook names it cannot give."""
    named = tuple(h for h in hooks if h not in (RESID, H.READOUT, H.FINAL))
    if named and not runner.takes_named_hooks:
        raise ConfigError(
            f"hooks {list(named)} need TransformerLens-named hook points (a GPT-2 family, linear self-attention or planted model); this model offers "
            f"only 'resid', '{H.READOUT}' and '{H.FINAL}'"
        )
    if H.FINAL in hooks and final_norm(model) is None:
        raise ConfigError(
            f"'{H.FINAL}' needs a model with a final LayerNorm; ask for '{H.READOUT}' (the stream "
            "the read-out sees) instead"
        )
    return Request(RESID in hooks, H.READOUT in hooks, H.FINAL in hooks, named)


def _positions(positions: str | Sequence[int], n: int) -> Tensor | None:
    """Token positions kept: None for all 2n, the x tokens, or checked indices."""
    if positions == "all":
        return None
    if positions == "x":
        return torch.arange(0, 2 * n, 2)
    try:
        indices = np.asarray(positions) if not isinstance(positions, str) else None
    except ValueError:  # a ragged nesting
        indices = None
    if (
        indices is None
        or indices.ndim != 1
        or indices.size == 0
        or indices.dtype.kind not in "iu"
        or indices.min() < 0
        or indices.max() >= 2 * n
    ):
        raise ConfigError(f'positions must be "all", "x" or token indices in 0..{2 * n - 1}, got {positions!r}'[:300])
    return torch.as_tensor(indices, dtype=torch.long)


def _storage(model, hooks: list[str], b: int, n_pos: int, out_dir, max_bytes: int):
    """(out_dir, spilled): stream to memmaps in a temporary directory when the result would exceed max_bytes."""
    per_prompt = _stored_bytes(model, hooks, 1, n_pos)
    if out_dir is None and per_prompt * b > max_bytes:
        out_dir = spill_dir()
        log.warning(
            "capture needs %.1f GiB (> max_bytes %.1f GiB): streaming to memmaps in %s",
            per_prompt * b / 2**30,
            max_bytes / 2**30,
            out_dir,
        )
        return out_dir, True
    return out_dir, False


def _stored_bytes(model, hooks: list[str], b: int, n_pos: int) -> int:
    return nbytes((((model.n_layers + 2) if RESID in hooks else 1), n_pos, model.d_model, b))


def _batch_within_budget(model, n: int, batch_size: int, kept: int, headroom: int) -> int:
    """`forward_batch` within what the memory budget leaves beside `kept` bytes."""
    return forward_batch(model, n, batch_size, headroom - kept)


def _public_bridge(model, device: str):

    return to_bridge(model, device)
