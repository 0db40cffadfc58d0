"""Every layer's residual stream at every token, laid out by position for the probes, within the
memory budget (spilled to a memmap on disk above half the headroom); and the column tokens some
planted models keep beside that stream."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.memory import MemoryBudget, nbytes
from ..core.validate import check_prompts_for, positive_int
from .activations import RESID, capture, spill_dir
from .stream_store import StreamShare, streams_key

CHUNK_BYTES = 32 << 20  # one chunk's streams (its forward's temporaries are a few times that)
MIN_CHUNK = 8
LAYER_CHUNK_BYTES = 8 << 20  # LayerStreams: one chunk's stream at one boundary


def by_position_streams(
    model,
    xs: Tensor,
    ys: Tensor,
    device: str = "cpu",
    chunk: int | None = None,
    dtype: torch.dtype = torch.float32,
    memory: MemoryBudget | None = None,
) -> Tensor:
    """Every layer boundary's residual stream at every token, by position: (L+1, 2n, N, D).

    Captured `chunk` prompts at a time (default: as many as CHUNK_BYTES of streams hold, at least
    MIN_CHUNK; the forward is batch-invariant, so the numbers do not depend on it), each batch's
    streams written straight into that layout (`capture(by_position=True)`), so the probes never
    hold a second copy; above half the headroom of `memory` (`--max-memory` less what the process
    holds) the array is a memmap on disk (resid.npy in a spill directory). With dtype float64 the
    model runs in double precision (on a copy), so that the streams agree across machines' kernels
    to ~1e-15 rather than ~1e-7."""
    n_prompts, n = xs.shape[:2]
    shape = (model.n_layers + 1, 2 * n, n_prompts, model.d_model)
    np_dtype = np.dtype(np.float64 if dtype == torch.float64 else np.float32)
    if chunk is None:
        chunk = max(MIN_CHUNK, CHUNK_BYTES // max(1, nbytes(shape[:2] + shape[3:], np_dtype)))
    memory = memory or MemoryBudget()
    spill = nbytes(shape, np_dtype) > memory.headroom() // 2
    cap = capture(
        model,
        xs,
        ys,
        hooks=[RESID],
        batch_size=chunk,
        device=device,
        out_dir=spill_dir() if spill else None,
        max_bytes=1 << 62,  # the chunk is the batch; the array is on disk or not by the rule above
        double=dtype == torch.float64,
        by_position=True,
    )
    return torch.from_numpy(cap.acts[RESID])


def column_count(model) -> int:
    """How many column tokens each prefix run of `model` keeps beside the interleaved stream (0 for
    every family but planted Newton's; `FamilyTraits.n_extra_tokens`)."""
    return int(getattr(model, "n_extra_tokens", 0))


def column_streams(
    model, xs: Tensor, ys: Tensor, device: str = "cpu", chunk: int = 64, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Every layer boundary's state of the tokens a model keeps beside the interleaved stream (the
    column tokens of a planted Newton model, probe/models/constructions/newton.py), in every prefix
    run: (L+1, N, n, E, D), run t seeing examples 0..t-1. Read through the model's hook points
    (blocks.{l}.hook_resid_pre, and the last block's hook_resid_post), `chunk` prompts at a time;
    with dtype float64 the model runs in double precision on a copy."""
    extra = column_count(model)
    if extra <= 0:
        raise ConfigError(
            f"this {type(model).__name__} keeps no column tokens (only planted linear-attention Newton models "
            "do): probe its x and y tokens"
        )
    xs, ys = check_prompts_for(model, xs, ys)
    if dtype == torch.float64 and any(p.dtype != torch.float64 for p in model.parameters()):
        model = copy.deepcopy(model).double()  # the caller's model stays as it is
    model = model.to(device).eval()
    n_prompts, n = xs.shape[:2]
    layers = model.n_layers
    out = torch.empty(layers + 1, n_prompts, n, extra, model.d_model, dtype=dtype)
    names = [f"blocks.{l}.hook_resid_pre" for l in range(layers)] + [f"blocks.{layers - 1}.hook_resid_post"]
    with torch.no_grad():
        for start in range(0, n_prompts, positive_int(chunk, "column chunk")):
            stop = min(start + chunk, n_prompts)
            seen: dict[int, Tensor] = {}
            rows = stop - start

            def keep(boundary: int, seen=seen, rows=rows):
                def fn(value: Tensor, hook) -> None:  # (B * n runs, T, D), prompt-major
                    seen[boundary] = value.view(rows, n, -1, value.shape[-1])[:, :, n : n + extra]

                return fn

            batch = (xs[start:stop].to(device, dtype), ys[start:stop].to(device, dtype))
            model.run_with_hooks(*batch, [(name, keep(i)) for i, name in enumerate(names)])
            for boundary, kept in seen.items():
                out[boundary, start:stop] = kept.to("cpu", dtype)
    return out


class LayerStreams:
    """The float64 streams of `by_position_streams`, (L+1, 2n, N, D), made a block of boundaries at a
    time as they are read (`streams[lo:hi]`, lo rising; the last block is kept for a second reader),
    for models that resume a forward from a layer (`FamilyTraits.key_value_cache`): the whole prompt
    set's stream is carried through one block after another (`resume`), `chunk` prompts at a time,
    so one boundary is held instead of L+1 (the token probes' streams at Garg et al.'s standard
    shape, 512 prompts: 86 MB instead of 1.1 GB). Each boundary is what `run` computes there, on
    a float64 copy of the model, as `by_position_streams(..., dtype=torch.float64)` gives it. With
    `share` (a report's `StreamStore`, probe/capture/stream_store.py) a boundary kept there by an
    earlier reader of the same model, prompts, chunking and device is read instead of computed, and
    one computed is kept where `share.keep`. Blocks are gathered on the host unless
    `blocks_on_device` (the probe study and the token probes, whose fits read them on `device`)."""

    def __init__(
        self,
        model,
        xs: Tensor,
        ys: Tensor,
        device: str = "cpu",
        chunk: int | None = None,
        share: StreamShare | None = None,
        blocks_on_device: bool = False,
    ):
        if not getattr(model, "key_value_cache", False):
            raise ConfigError(
                f"{type(model).__name__} cannot resume a forward from a layer: capture with by_position_streams"
            )
        xs, ys = check_prompts_for(model, xs, ys)
        self.model = copy.deepcopy(model).double().to(device).eval()  # the caller's model stays as it is
        n_prompts, n = xs.shape[:2]
        self.shape = (model.n_layers + 1, 2 * n, n_prompts, model.d_model)
        per_prompt = nbytes((2 * n, model.d_model), np.dtype(np.float64))
        # a block's forward holds several times its chunk's stream (queries, keys, values, scores, the MLP's 4D)
        self.chunk = chunk or max(MIN_CHUNK, LAYER_CHUNK_BYTES // max(1, per_prompt))
        self.xs, self.ys = xs.to(device, torch.float64), ys.to(device, torch.float64)
        self.share, self.block_device = share, (device if blocks_on_device else "cpu")
        self.key = "" if share is None else streams_key(model, xs, ys, self.chunk, str(device))
        self.stream: Tensor | None = None  # (N, 2n, D): the boundary `self.next - 1`
        self.next = 0
        self.last: tuple[slice, Tensor] | None = None

    def _advance(self) -> Tensor:
        """The stream at boundary `self.next` (N, 2n, D), computed from the one before."""
        _, n_tokens, n_prompts, width = self.shape
        if self.share is not None:
            kept = self.share.store.get(self.key, self.next, (n_prompts, n_tokens, width))
            if kept is not None:
                self.stream, self.next = kept.to(self.xs.device), self.next + 1
                return self.stream
        stream = torch.empty(n_prompts, n_tokens, width, dtype=torch.float64, device=self.xs.device)
        with torch.no_grad():  # each chunk written in place: no list of chunks beside the stream
            for s in range(0, n_prompts, self.chunk):
                if self.next == 0:
                    stream[s : s + self.chunk] = self.model.embed_prompts(
                        self.xs[s : s + self.chunk], self.ys[s : s + self.chunk]
                    )
                else:
                    assert self.stream is not None
                    stream[s : s + self.chunk] = self.model.resume(
                        self.stream[s : s + self.chunk], self.next - 1, self.next
                    )
        if self.share is not None and self.share.keep:
            self.share.store.put(self.key, self.next, stream)
        self.stream, self.next = stream, self.next + 1
        return stream

    def release(self) -> None:
        """Forget the block kept for a second reader (its readers are done with it)."""
        self.last = None

    def __getitem__(self, rows: slice) -> Tensor:
        if self.last is not None and self.last[0] == rows:
            return self.last[1]
        lo, hi, step = rows.indices(self.shape[0])
        if step != 1 or lo != self.next:
            raise ValueError(
                f"LayerStreams are read in order, a block at a time: asked for {lo}..{hi - 1}, next {self.next}"
            )
        self.last = None  # the previous block goes before this one is made (its reader has moved on)
        block = torch.empty((hi - lo, *self.shape[1:]), dtype=torch.float64, device=self.block_device)  # (k, 2n, N, D)
        for i in range(hi - lo):  # each boundary copied in as it is made: one stream held, not k
            block[i] = self._advance().transpose(0, 1)
        self.last = (rows, block)
        return block
