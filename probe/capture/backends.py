"""Capture back-ends: how one batch of prompts is run and its activations collected, per model family.

A back-end returns a `BatchActivations` in one standard form (layer boundaries, the read-out's
stream, TransformerLens's pre-affine final stream, named hooks), so `capture` only batches,
selects positions and stores. Back-ends are found through a registry, as TransformerLens maps
architectures to adapters:

    "hooked"    the GPT-2 family: its own forward, read at TransformerLens-named hook points
                (probe/models/hooked.py), so any of those names can be asked for
    "planted"   planted linear-attention models: "hooked" with one sequence per prefix run
    "native"    anything with the ICLModel protocol's `run` (the LSTM, your own model)

A model family class names its own (`capture_backend`, probe/models/base.py FamilyTraits);
a model of no family gets "native".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.registry import Registry
from ..models.base import ICLModel


@dataclass
class BatchActivations:
    pred: Tensor  # (b, n)
    resid: list[Tensor] = field(default_factory=list)  # L+1 boundaries (b, 2n, D), when asked for
    readout: Tensor | None = None  # the stream the read-out sees, (b, 2n, D)
    normalized: Tensor | None = None  # TransformerLens's ln_final.hook_normalized (before ln_f's affine map)
    named: dict[str, Tensor] = field(default_factory=dict)  # other hook names, as TransformerLens gives them


@dataclass(frozen=True)
class Request:
    """What a capture asks of a back-end."""

    resid: bool
    readout: bool
    normalized: bool
    named: tuple[str, ...]
    positions: tuple[int, ...] | None = None  # token positions kept (None: all); a back-end may skip the rest


def final_norm(model) -> torch.nn.LayerNorm | None:
    """The model's final LayerNorm (GPT-2 family), or None."""
    ln_f = getattr(model, "final_norm", None)
    return ln_f if isinstance(ln_f, torch.nn.LayerNorm) else None


class Backend:
    name = ""
    takes_named_hooks = False

    def __init__(self, model: ICLModel, device: str):
        self.model: Any = model  # the family's own class; the registry pairs them
        self.device = device

    def run(self, xs: Tensor, ys: Tensor, request: Request) -> BatchActivations:
        raise NotImplementedError


BACKENDS: Registry[type[Backend]] = Registry("capture backend")


@BACKENDS.register("native")
class NativeBackend(Backend):
    """The model's own `run`: boundaries and the read-out's stream (any ICLModel)."""

    name = "native"

    def run(self, xs: Tensor, ys: Tensor, request: Request) -> BatchActivations:
        return self.collect(self.model.run(xs, ys), request)

    def collect(self, out, request: Request) -> BatchActivations:
        """The standard form of one forward's ModelOutput."""
        acts = BatchActivations(out.pred, list(out.resid) if request.resid else [], out.final)
        if request.normalized:
            ln_f = final_norm(self.model)
            assert ln_f is not None  # checked by capture
            acts.normalized = torch.nn.functional.layer_norm(out.resid[-1], (self.model.d_model,), eps=ln_f.eps)
        return acts


@BACKENDS.register("hooked")
class HookedBackend(NativeBackend):
    """The model's own forward with functions on its TransformerLens-named hook points copying the
    named activations asked for (probe/models/hooked.py); boundaries and streams as `native`."""

    name = "hooked"
    takes_named_hooks = True

    def run(self, xs: Tensor, ys: Tensor, request: Request) -> BatchActivations:
        caught: dict[str, Tensor] = {}

        def keep(value: Tensor, hook, name: str) -> None:
            caught[name] = value.detach()

        fwd = [(name, partial(keep, name=name)) for name in request.named]
        acts = self.collect(self.forward(xs, ys, fwd, request), request)
        acts.named = {name: self.per_prompt(caught[name], xs.shape[0]) for name in request.named}
        return acts

    def forward(self, xs: Tensor, ys: Tensor, fwd: list, request: Request):
        return self.model.run_with_hooks(xs, ys, fwd)

    def per_prompt(self, value: Tensor, n_prompts: int) -> Tensor:
        """A hook's value with the prompts on axis 0."""
        return value


@BACKENDS.register("planted")
class PlantedBackend(HookedBackend):
    """Planted models: their hooked forward, one sequence per prefix run, so a named hook's value
    has one entry per run, (b, n, ...). With positions and no named hook, only the runs those
    positions are read from are computed."""

    name = "planted"

    def forward(self, xs: Tensor, ys: Tensor, fwd: list, request: Request):
        runs = None
        if request.positions is not None and not request.named:  # named hooks keep every run's entry
            runs = self.model.runs_reading(request.positions, xs.shape[1])
        out = self.model.run_with_hooks(xs, ys, fwd, runs)
        if runs is not None:  # runs not computed predict nothing: NaN (capture's docstring)
            pred = torch.full((xs.shape[0], xs.shape[1]), math.nan, dtype=out.pred.dtype, device=out.pred.device)
            pred[:, runs] = out.pred
            out.pred = pred
        return out

    def per_prompt(self, value: Tensor, n_prompts: int) -> Tensor:
        return value.reshape(n_prompts, -1, *value.shape[1:])


def backend_for(model, choice: str, device: str) -> Backend:
    """The back-end for `model`: "auto" or "hooked" picks its family's (its class's `capture_backend`,
    probe/models/base.py FamilyTraits: TransformerLens hook names for transformers), "native" its
    plain `run`."""
    declared = getattr(type(model), "capture_backend", "native")
    hooked = None if declared == "native" else declared
    if choice == "auto":
        choice = hooked or "native"
    elif choice == "hooked":
        if hooked is None:
            raise ConfigError(
                "the hooked backend needs a GPT-2 family, linear self-attention or planted model; use backend='native'"
            )
        choice = hooked
    elif choice != "native":
        raise ConfigError(
            f"backend must be 'auto', 'hooked' (TransformerLens hook names on the model's own forward) or "
            f"'native', got {choice!r}"
        )
    return BACKENDS.get(choice)(model, device)
