"""What every in-context regression model returns when run on prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import Tensor

from ..core.budget import Shape
from ..core.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from .config import ModelConfig


@dataclass
class ModelOutput:
    pred: Tensor  # (B, n): prediction for y_i read at the x_i token
    resid: list[Tensor]  # L+1 tensors (B, 2n, D): embedding output, then the raw stream after each layer
    final: Tensor  # (B, 2n, D): the stream the read-out sees (after ln_f for GPT-2; = resid[-1] for LSTM)


@runtime_checkable
class ICLModel(Protocol):
    """The model protocol: what every analysis needs, and all a new architecture must provide.

    Any torch module with these members can be analysed (see README, "Bring your own model"):

        n_dims: int        # d, the dimension of x
        n_layers: int      # L: hidden states exist at boundaries 0..L
        d_model: int       # width of the hidden states
        n_points: int      # the most (x, y) examples a prompt may hold
        run(xs, ys) -> ModelOutput   # pred (B, n), resid: L+1 x (B, 2n, D), final (B, 2n, D)
        readout(final) -> Tensor     # the model's own read-out, (..., D) -> (...)

    Optionally `lens(resid) -> Tensor`, the model's own read-out applied to any layer's raw
    stream (GPT-2: read_out(ln_f(h))), enables `readout_method = "model"` in the analyses.
    """

    n_dims: int
    n_layers: int
    d_model: int
    n_points: int

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput: ...

    def readout(self, final: Tensor) -> Tensor: ...


class FamilyTraits:
    """What a model family declares about itself (class attributes; defaults here), so that no code
    outside the family's module dispatches on its name: whether a fresh instance is a random-weights
    control (`random_init`), whether `n_head` counts attention heads (`attention_heads`), whether
    `attn_activation` applies (`attention_activation`), whether Garg et al.'s train.py can hold it
    (`garg_format`), whether its weights file's size follows its config (`sized_by_config`), and
    whether it can resume a forward from a layer with a key/value cache (`key_value_cache`: it then
    has `resume`, probe/analysis/states.py), and how many tokens each prefix run holds beside the
    interleaved examples and query (`n_extra_tokens`: a planted Newton model's column tokens; they
    are captured by `probe.capture.streams.column_streams`), and whether TransformerLens's own
    TransformerBridge can hold it (`transformer_lens_bridge`: probe.to_bridge, a capture's
    ActivationCache tied to it), which capture back-end records its activations (`capture_backend`:
    "native" its own `run`, "hooked" TransformerLens hook names on its forward, "planted"; a name in
    probe/capture/backends.py BACKENDS) and which intervention runner ablates, patches and steers it
    (`intervention_runner`: a name in probe/interventions/runner.py RUNNERS; "" where it has no
    TransformerLens form). Class methods: its own rules on a [model] section (`check_config`),
    its sizes for the budget (`shape`), the report recipe as it applies to it (`adapt_recipe`); each
    family class also gives `parameter_count(cfg)`, its memory estimate (probe/models/sizes.py)."""

    random_init: bool = True
    attention_heads: bool = False
    attention_activation: bool = False
    garg_format: bool = False
    sized_by_config: bool = True
    key_value_cache: bool = False
    transformer_lens_bridge: bool = False
    capture_backend: str = "native"
    intervention_runner: str = ""

    @property
    def n_extra_tokens(self) -> int:
        return 0

    @classmethod
    def adapt_recipe(cls, recipe: Any, config: Any) -> Any:
        """The report recipe as it applies to a checkpoint of this family (unchanged by default)."""
        return recipe

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        """Refuse a [model] section this family cannot be built from (ModelConfig calls it); the
        default rule: `attn_activation` is only for families that declare `attention_activation`."""
        if not cls.attention_activation and cfg.attn_activation != "softmax":
            raise ConfigError(
                f"model.attn_activation applies to the gpt2 family only; remove it for a {cfg.family} model"
            )

    @classmethod
    def shape(cls, cfg: ModelConfig) -> Shape:
        """Its sizes for the affordability estimates (probe/core/budget.py), from the config alone."""
        return Shape(max(cfg.n_layer, 1), max(cfg.n_embd, 1), cfg.n_dims)


class ConfigSizes(FamilyTraits):
    """The protocol's sizes of the toolkit's own models, read from `self.config`."""

    config: ModelConfig

    @property
    def n_dims(self) -> int:
        return self.config.n_dims

    @property
    def n_layers(self) -> int:
        return self.config.n_layer

    @property
    def d_model(self) -> int:
        return self.config.n_embd

    @property
    def n_points(self) -> int:
        return self.config.n_positions


class ReadInOutModel(ConfigSizes):
    """Shared members of the models with a read-in, layers and a Linear(D, 1) read-out (GPT-2, LSTM):
    the sizes from `self.config`, the read-out from `self._read_out`."""

    _read_out: nn.Linear

    def readout(self, final: Tensor) -> Tensor:
        return self._read_out(final)[..., 0]
