"""Capture back-ends: how one batch of prompts is run and its activations collected, per model family.

A back-end returns a `BatchActivations` in one standard form (layer boundaries, the read-out's
stream, TransformerLens's pre-affine final stream, named hooks), so `capture` only batches,
selects positions and stores. Back-ends are found through a registry, as TransformerLens maps
architectures to adapters:

    "transformer_lens"   GPT-2 family: a TransformerBridge (probe/capture/bridge.py)
    "planted"            planted linear-attention models: one bridge sequence per prefix run
    "native"             anything with the ICLModel protocol's `run` (the LSTM, your own model)

A model class names its own in `capture_backend` (default "native").
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
from ..data.positions import X_TOKENS
from ..models.base import ICLModel
from . import hooks as H
from .bridge import bridge_inputs, cached_bridge
from .planted_bridge import run_through_bridge


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
        out = self.model.run(xs, ys)
        acts = BatchActivations(out.pred, list(out.resid) if request.resid else [], out.final)
        if request.normalized:
            ln_f = final_norm(self.model)
            assert ln_f is not None  # checked by capture
            acts.normalized = torch.nn.functional.layer_norm(out.resid[-1], (self.model.d_model,), eps=ln_f.eps)
        return acts


@BACKENDS.register("transformer_lens")
class BridgeBackend(Backend):
    """GPT-2 family through its TransformerBridge, with forward hooks copying what is asked for."""

    name = "transformer_lens"
    takes_named_hooks = True

    def __init__(self, model: ICLModel, device: str):

        super().__init__(model, device)
        self.bridge = cached_bridge(self.model, device)

    @staticmethod
    def _keep(value: Tensor, hook, name: str, store: dict[str, Tensor]) -> None:
        # `name` is the name asked for (TransformerLens may report an alias in hook.name)
        store[name] = value.detach()

    def run(self, xs: Tensor, ys: Tensor, request: Request) -> BatchActivations:

        wanted = set(request.named)
        if request.resid:
            wanted |= set(H.resid_names(self.model.n_layers))
        if request.readout or request.normalized:
            wanted.add(H.FINAL)
        caught: dict[str, Tensor] = {}
        fwd = [(name, partial(self._keep, name=name, store=caught)) for name in sorted(wanted)]
        try:
            logits = self.bridge.run_with_hooks(bridge_inputs(self.model, xs, ys), fwd_hooks=fwd)
        except (KeyError, ValueError, AttributeError) as err:
            raise ConfigError(f"unknown hook among {sorted(request.named)}: {err}; {_examples()}") from None
        missing = wanted - set(caught)
        if missing:
            raise ConfigError(f"unknown hook '{min(missing)}'; {_examples()}")
        acts = BatchActivations(
            logits[:, X_TOKENS, 0], [caught[h] for h in H.resid_names(self.model.n_layers)] if request.resid else []
        )
        if H.FINAL in caught:
            acts.normalized = caught[H.FINAL]
            ln_f = final_norm(self.model)
            assert ln_f is not None
            acts.readout = caught[H.FINAL] * ln_f.weight + ln_f.bias  # the read-out's input: ln_f's affine map added
        acts.named = {name: caught[name] for name in request.named}
        return acts


@BACKENDS.register("planted")
class PlantedBackend(Backend):
    """Planted linear-attention models through TransformerLens, one bridge sequence per prefix run:
    a named hook's value has one entry per run, (b, n, ...)."""

    name = "planted"
    takes_named_hooks = True

    def run(self, xs: Tensor, ys: Tensor, request: Request) -> BatchActivations:

        runs = None
        if request.positions is not None and not request.named:  # named hooks keep every run's entry
            runs = self.model.runs_reading(request.positions, xs.shape[1])
        out, extra = run_through_bridge(
            self.model, xs, ys, {name: None for name in request.named}, self.device, runs=runs
        )
        pred = out.pred
        if runs is not None:  # runs not computed predict nothing: NaN (capture's docstring)
            pred = torch.full((xs.shape[0], xs.shape[1]), math.nan, dtype=out.pred.dtype, device=out.pred.device)
            pred[:, runs] = out.pred
        return BatchActivations(pred, list(out.resid) if request.resid else [], out.final, None, extra)


def _examples() -> str:
    return f"examples of valid names: {H.resid(1)}, {H.attn_pattern(0)}, blocks.0.hook_mlp_out"


def backend_for(model, choice: str, device: str) -> Backend:
    """The back-end for `model`: "auto" picks the one its class declares (`capture_backend`:
    TransformerLens for transformers), else "native"."""
    declared = getattr(model, "capture_backend", "native")
    lens = declared if declared != "native" else None
    if choice == "auto":
        choice = lens or "native"
    elif choice == "transformer_lens":
        if lens is None:
            raise ConfigError(
                "the transformer_lens backend needs a GPT-2 family or planted model; use backend='native'"
            )
        choice = lens
    elif choice != "native":
        raise ConfigError(f"backend must be 'auto', 'transformer_lens' or 'native', got {choice!r}")
    return BACKENDS.get(choice)(model, device)
