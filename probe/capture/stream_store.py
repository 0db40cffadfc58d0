"""A report's float64 layer streams kept on disk for a later reader of the same prompts.

The probe study and the token probes both read the model's float64 residual stream at every layer
boundary over the probes' training and test prompts (probe/core/seeds.py PROBE_TRAIN, PROBE_TEST),
each a block of layers at a time (`LayerStreams`, probe/capture/streams.py). Within one report the
first of them writes each boundary to disk as it makes it and the later one reads it back instead
of running the model again: the same numbers, bit for bit, since the reader gets the very values
the writer computed, on the same prompts, chunking and device (all in the key). At Garg et al.'s
standard shape (512 + 256 prompts, 13 boundaries) that is ~1.7 GB on disk against ~20 s of float64
forwards. Files are read with plain reads, not mapped, so they never count as resident memory;
they go under the system's temporary directory (TMPDIR), which should be on disk: on a RAM-backed
/tmp they take memory instead. The directory is removed when the report's stages are done
(`close`), and by the next run if the process died (`spill_dir`)."""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

SPARE_BYTES = 1 << 30  # disk left free after a boundary is written; below it the store stops writing


def streams_key(model, xs: Tensor, ys: Tensor, chunk: int, device: str) -> str:
    """A digest of what a float64 stream depends on: the model's class and state, the prompts, the
    chunking and the device."""
    digest = hashlib.blake2b(f"{type(model).__name__}|{chunk}|{device}".encode(), digest_size=16)
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str((tuple(value.shape), value.dtype)).encode())
        digest.update(np.ascontiguousarray(value.detach().cpu().numpy()).tobytes())
    for prompts in (xs, ys):
        digest.update(str(tuple(prompts.shape)).encode())
        digest.update(np.ascontiguousarray(prompts.detach().cpu().numpy()).tobytes())
    return digest.hexdigest()


PromptSet = tuple[int, int]  # (probe/core/seeds.py stream, prompt count): the prompts a stream is made over


class StreamStore:
    """Float64 boundaries of `LayerStreams` on disk for the report's `readers`: stage name -> the
    prompt sets whose streams it reads, in running order, for the stages that will run. A reader
    keeps what it makes of a prompt set only where a later reader reads that set too."""

    def __init__(self, readers: dict[str, Iterable[PromptSet]] | None = None):
        self.readers = {name: frozenset(sets) for name, sets in (readers or {}).items()}
        self.root: Path | None = None
        self.writing = True  # False after a write failed or the disk ran short

    def reader(self, name: str) -> StreamReader | None:
        """The store as stage `name` uses it (None: it is not one of the readers)."""
        if name not in self.readers:
            return None
        names = list(self.readers)
        later = [self.readers[other] for other in names[names.index(name) + 1 :]]
        return StreamReader(self, frozenset().union(*later))

    def _path(self, key: str, boundary: int) -> Path | None:
        return None if self.root is None else self.root / f"{key}-{boundary}.f64"

    def get(self, key: str, boundary: int, shape: tuple[int, ...]) -> Tensor | None:
        """The stream kept for (key, boundary), (N, 2n, D) float64 on the CPU, or None."""
        path = self._path(key, boundary)
        if path is None or not path.exists():
            return None
        values = np.fromfile(path, dtype=np.float64)
        if values.size != int(np.prod(shape)):
            log.warning("stream store: %s holds %d values, not %s; recomputing it", path.name, values.size, shape)
            return None
        return torch.from_numpy(values.reshape(shape))

    def put(self, key: str, boundary: int, stream: Tensor) -> None:
        """Keep `stream` for (key, boundary); a full disk or a failed write stops the store writing
        (a later reader then runs the model itself), never the report."""
        if not self.writing:
            return
        values = stream.detach().to("cpu", torch.float64).contiguous().numpy()
        try:
            if self.root is None:
                from .activations import spill_dir

                self.root = Path(spill_dir())
            if shutil.disk_usage(self.root).free < values.nbytes + SPARE_BYTES:
                log.warning("stream store: too little disk left under %s; the next reader runs the model", self.root)
                self.writing = False
                return
            path = self._path(key, boundary)
            assert path is not None
            partial = path.with_suffix(".part")
            values.tofile(partial)
            partial.replace(path)  # a reader never sees half a boundary
        except OSError as err:
            log.warning("stream store: could not keep a stream (%s); the next reader runs the model", err)
            self.writing = False

    def close(self) -> None:
        """Remove what was kept."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class StreamReader:
    """One stage's use of a `StreamStore`: `later`, the prompt sets a later reader reads."""

    store: StreamStore
    later: frozenset[PromptSet]

    def share(self, stream: int, count: int) -> StreamShare:
        """What `LayerStreams` over the `count` prompts of `stream` takes: it reads what is kept, and
        keeps what it makes where a later reader reads the same prompt set."""
        return StreamShare(self.store, keep=(int(stream), int(count)) in self.later)


@dataclass(frozen=True)
class StreamShare:
    """One reader's use of a `StreamStore`: it reads what is kept, and keeps what it makes where
    `keep` (a later reader will ask for it)."""

    store: StreamStore
    keep: bool
