"""What a planted construction is: one class per construction says everything about it (its token
layout, heads, MLP, tokens, weights, defaults and checks, layer schedule, label, the learner it
runs and how a report compares it), and `CONSTRUCTIONS` names them. The architecture they all
run on is `PlantedICL` (probe/models/planted.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ...core.errors import ConfigError
from ...core.registry import Registry
from ...data.positions import prefix_mask
from ..learner_state import LearnerState

if TYPE_CHECKING:
    from ...core.settings import SweepSettings
    from ..config import ModelConfig
    from ..planted import PlantedICL


class Layout:
    """Named slots of the token vector, from (name, size) pairs in order."""

    def __init__(self, names: list[tuple[str, int]]):
        self.slots, start = {}, 0
        for name, size in names:
            self.slots[name] = slice(start, start + size)
            start += size
        self.width = start

    def __getitem__(self, name: str) -> slice:
        return self.slots[name]


def select(layout: Layout, rows: str, cols: str, scale: float = 1.0) -> Tensor:
    """A (width, width) matrix copying slot `cols` of the input into slot `rows` of the output."""
    m = torch.zeros(layout.width, layout.width)
    r, c = layout[rows], layout[cols]
    m[r, c] = scale * torch.eye(r.stop - r.start)
    return m


@dataclass
class PlantOptions:
    """The construction options `icl-probe planted` takes (None: the construction's default)."""

    step_size: float | None = None  # GD / SGD / Adam step eta
    alpha: float | None = None  # Newton's fixed M_0 = alpha S/t
    eps: float = 0.05  # uniform: ramp half-width of the empirical CDF
    batch: int = 4  # SGD / Adam: minibatch size K
    seed: int = 0  # SGD / Adam: seed of the minibatch masks
    outputs: int = 4  # prng: numbers M one block emits


def gd_stable_limit(d: int) -> float:
    """Largest step eta for which GD on ||y - Xw||^2/(2t) stays stable on typical prompts:
    2 / (1 + sqrt(d))^2, the Marchenko-Pastur edge of S/t at t = 1 (Fu et al. 2024, §2, REFERENCE §2)."""
    return 2.0 / (1 + math.sqrt(d)) ** 2


class Construction:
    """A construction's description; subclasses set the class attributes and override what differs.

    Layer schedule: boundary l >= `first` holds step / iteration (l - first) // `per_step` of
    `learner` (`first` None: the construction runs no iterative learner)."""

    name: ClassVar[str]
    title: ClassVar[str]  # how reports name it
    learner: ClassVar[str] = ""  # the learner (probe/learners) it runs
    unit: ClassVar[str] = "step"  # what `per_step` layers compute
    first: ClassVar[int | None] = None
    per_step: ClassVar[int] = 1
    heads: ClassVar[int] = 1  # attention heads per layer
    relu_attention: ClassVar[bool] = False  # sigma(a) = ReLU(a) (Fu et al. 2024, Def. 5) instead of linear attention
    learner_state: ClassVar[LearnerState | None] = None  # where it keeps a matrix iterate (the causal state check)
    matching_sweep: ClassVar[str] = ""  # the sweep whose SimE layer map its report checks
    sibling: ClassVar[str] = ""  # another construction of the same learner, whose schedule the report cites

    # -- shape
    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        raise NotImplementedError

    def layout(self, cfg: ModelConfig) -> Layout:
        return Layout(self.slots(cfg))

    def n_heads(self, cfg: ModelConfig) -> int:
        return self.heads

    def d_mlp(self, cfg: ModelConfig) -> int:
        """Hidden size of each layer's ReLU MLP (0: none)."""
        return 0

    def extra_tokens(self, cfg: ModelConfig) -> int:
        """Tokens between the example slots and the query in each run."""
        return 0

    def mask_steps(self, cfg: ModelConfig) -> int:
        """Minibatch mask steps the model holds (Hataya & Imaizumi 2024, Assumption 1; 0: none)."""
        return 0

    def sizes(self, cfg: ModelConfig) -> tuple[int, int, int]:
        """(token width, heads per layer, MLP hidden size), from the config alone."""
        return self.layout(cfg).width, self.n_heads(cfg), self.d_mlp(cfg)

    # -- running
    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Fill the runs' zero tokens h (B, n, T, W) for prompts (xs, ys); returns them and each run's
        divisor of its per-example heads (n,). Default: example i of run t holds (x_i, y_i) in the
        slots "x" and `target_slot` for i < t, the query token x_{t+1} in "xq"; divisor t."""
        b, n, _ = xs.shape
        s, seen = model.layout, prefix_mask(n, xs.device).to(xs.dtype).view(1, n, n, 1)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        h[:, :, :n, s[self.target_slot]] = ys.view(b, 1, n, 1) * seen
        h[:, :, -1, s["xq"]] = xs  # run t queries x_{t+1}
        return h, torch.arange(n, dtype=xs.dtype, device=xs.device)

    target_slot: ClassVar[str] = "y"

    def plant(self, model: PlantedICL) -> None:
        """Write the construction's weights into a zero model."""
        raise NotImplementedError

    # -- configuration
    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        """The ModelConfig fields of this construction (planted_scale, ...), its options' defaults
        filled and checked; a ConfigError names the option and a value that works."""
        raise NotImplementedError

    def layer_map(self, layer: int) -> int | None:
        """The step / iteration whose prediction boundary `layer` holds (None: it predicts 0)."""
        if self.first is None or layer < self.first:
            return None
        return (layer - self.first) // self.per_step

    def adapt_sweeps(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        """Fit a report's sweeps (in place) to a model of this construction: its learner's exact
        hyper-parameters, and any sweeps it alone has."""


CONSTRUCTIONS: Registry[Construction] = Registry("planted algorithm")


def construction(cls: type[Construction]) -> type[Construction]:
    """Class decorator: register one instance of a construction under its name."""
    CONSTRUCTIONS.register(cls.name)(cls())
    return cls


def check_step(step: float, limit: float, d: int, what: str) -> float:
    """A step eta in (0, limit), or a ConfigError suggesting limit / 2."""
    if not 0 < step < limit:
        raise ConfigError(
            f"--step-size {step} is unstable for d={d}: {what} needs 0 < eta < 2/(1+sqrt d)^2 = {limit:.4f} on "
            f"short prefixes; try {limit / 2:.4f}"
        )
    return float(step)


def require_one_block(name: str, layers: int, theorem: str) -> None:
    if layers != 1:
        raise ConfigError(f"a planted {name} model is one block (Hataya & Imaizumi 2024, {theorem}); use --layers 1")
