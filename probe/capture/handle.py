"""The public TransformerLens handle: `to_bridge(checkpoint_or_model)` returns a TransformerBridge
that takes in-context prompts directly.

`ICLBridge` is TransformerLens's own `TransformerBridge` (the GPT-2 weights mapped as in
probe/capture/bridge.py) whose entry points also accept a prompt pair `(xs, ys)`: it interleaves
the tokens (x_1, y_1, x_2, ...), applies the model's read-in and fires `hook_embed` on the result
(so the read-in can be hooked, cached or patched like a token embedding); the bridge then adds
the positional embedding (`hook_pos_embed`) and runs the blocks. Everything else is plain
TransformerLens: `run_with_cache`, `run_with_hooks`, `hooks()`, `ActivationCache`. The logits are
(B, 2n, 1); the prediction for y_i is read at the x_i token: `bridge.predictions(logits)`.

    bridge = to_bridge("checkpoints/gpt2-default")
    logits, cache = bridge.run_with_cache((xs, ys))
    cache["blocks.3.hook_resid_post"]          # (B, 2n, D)

TransformerLens's own utilities take token tensors and read their `.shape`; `prompt(xs, ys)`
wraps the pair so that they run unchanged, e.g. its activation patching:

    from transformer_lens import patching
    _, clean = bridge.run_with_cache(prompt(xs, ys))
    patching.get_act_patch_resid_pre(bridge, prompt(xs, ys_corrupted), clean, metric)  # (L, 2n)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.validate import check_device, check_prompts_for
from ..data.positions import X_TOKENS
from ..io.checkpoint import LoadedCheckpoint
from ..io.formats import load_checkpoint
from .bridge import bridge_inputs
from .bridge import to_bridge as native_bridge

_TRANSFORMER_BRIDGE: type | None = None


class Prompt(tuple):
    """An in-context prompt (xs (B, n, d), ys (B, n)) as a TransformerLens input: a bridge from
    `to_bridge` takes it wherever TransformerLens takes tokens, and `.shape` is the token layout
    (B, 2n) that TransformerLens's utilities (patching, ...) read."""

    def __new__(cls, xs, ys) -> Self:
        return super().__new__(cls, (torch.as_tensor(xs), torch.as_tensor(ys)))

    @property
    def shape(self) -> torch.Size:
        xs = self[0]
        return torch.Size((xs.shape[0], 2 * xs.shape[1]))

    @property
    def device(self) -> torch.device:
        return self[0].device

    def to(self, *args: Any, **kwargs: Any) -> Prompt:
        return Prompt(self[0].to(*args, **kwargs), self[1].to(*args, **kwargs))


def prompt(xs, ys) -> Prompt:
    """The prompt pair (xs, ys) as a TransformerLens input (see `Prompt`)."""
    return Prompt(xs, ys)


def _bridge_class() -> type:
    """ICLBridge, defined on first use (TransformerLens is imported lazily)."""
    global _TRANSFORMER_BRIDGE
    if _TRANSFORMER_BRIDGE is None:
        from transformer_lens import TransformerBridge

        class ICLBridge(TransformerBridge):
            """A TransformerBridge whose inputs may be in-context prompts `(xs, ys)`."""

            def _prompt_embeddings(self, prompt: tuple) -> Tensor:

                model = self.__dict__["_icl_model"]
                if len(prompt) != 2:  # checked here so a 3-tuple gets our message, not TL's
                    raise ConfigError("an in-context prompt is a pair (xs, ys): xs (B, n, d), ys (B, n)")
                xs, ys = check_prompts_for(model, *prompt)
                device = next(model.parameters()).device
                return self.embed.hook_out(bridge_inputs(model, xs.to(device), ys.to(device)))

            def forward(self, input: Any, *args: Any, **kwargs: Any) -> Any:
                if _is_prompt(input):
                    input = self._prompt_embeddings(tuple(input))
                return super().forward(input, *args, **kwargs)

            @staticmethod
            def predictions(logits: Tensor) -> Tensor:
                """Predictions (B, n) from the bridge's logits (B, 2n, 1): the prediction for y_i
                is read at the x_i token (position 2(i-1)), before y_i is seen."""
                return logits[:, X_TOKENS, 0]

            @staticmethod
            def query_position(t: int) -> int:
                """The token position whose output predicts y_{t+1} after t examples: x_{t+1}'s, 2t."""
                return 2 * int(t)

            @staticmethod
            def token_positions(n: int) -> dict[str, Tensor]:
                """Positions in the interleaved sequence of a prompt of n points: "x" (x_1..x_n at
                0, 2, ..., 2n-2; each is also the query of the prediction for its y) and "y" (1, 3, ...)."""
                return {"x": torch.arange(0, 2 * n, 2), "y": torch.arange(1, 2 * n, 2)}

            @property
            def task(self):
                """The checkpoint's task (TaskConfig: d, points, noise, ...), or None for a bare model."""
                return self.__dict__.get("_icl_task")

        _TRANSFORMER_BRIDGE = ICLBridge
    return _TRANSFORMER_BRIDGE


def _is_prompt(value: Any) -> bool:
    """A prompt pair (xs, ys) of tensors or arrays, as opposed to TransformerLens's own inputs."""
    import numpy as np

    return (
        isinstance(value, (tuple, list)) and len(value) > 0 and all(isinstance(v, (Tensor, np.ndarray)) for v in value)
    )


def _model_of(source) -> tuple[Any, Any]:
    """(model, its task or None)."""
    if isinstance(source, (str, Path)):
        source = load_checkpoint(source)
    if isinstance(source, LoadedCheckpoint):
        return source.model, source.config.task
    return source, None


def to_bridge(source, device: str = "cpu"):
    """A TransformerLens `TransformerBridge` computing exactly the model's forward, fed `(xs, ys)`.

    source: a checkpoint path (any format icl-probe loads), a LoadedCheckpoint, or a GPT2ICL
    model. The bridge carries the checkpoint's `task` and names its token positions
    (`token_positions(n)`, `query_position(t)`; `predictions(logits)` reads at them). The bridge is a new object with its own copy of the weights: editing it does not
    change the model. Planted and recurrent models have no single-sequence TransformerLens form
    (a planted model runs one sequence per prefix; its own forward has TransformerLens-named hook
    points, probe/models/planted.py); they are refused here with a message.
    """

    model, task = _model_of(source)
    if not getattr(model, "transformer_lens_bridge", False):  # a family trait (probe/models/base.py)
        raise ConfigError(
            f"to_bridge needs a GPT-2 family model (own, Garg or Hugging Face format); got "
            f"{type(model).__name__}. Planted models run one sequence per prefix run, with TransformerLens "
            "hook names on their own forward (model.run_with_hooks); the LSTM has no TransformerLens form"
        )
    device = check_device(device)
    model = model.to(device).eval()
    bridge = native_bridge(model, device)
    bridge.__class__ = _bridge_class()  # same object and state, with prompt-aware entry points
    bridge.__dict__["_icl_model"] = model  # not a submodule: the bridge's state dict stays TL's own
    bridge.__dict__["_icl_task"] = task
    return bridge
