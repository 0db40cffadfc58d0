"""The model a run trains or a checkpoint holds: recipe section [model], and the registry of model
families (each family class registers itself in `FAMILIES`; `ModelConfig.family` is checked
against it, and the rest of the section by the family class's own `check_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.config import Section, setting
from ..core.registry import Registry

FAMILIES: Registry[Any] = Registry(
    "model family", plugins="icl_probe.families"
)  # name -> model class (gpt2.py, lstm.py, planted.py)
ENCODINGS = ("garg", "akyurek")  # probe/models/encoding.py
ATTENTION_ACTIVATIONS = (
    "softmax",
    "relu",
)  # GPT-2 attention weights: softmax, or ReLU / #keys (Wu et al. 2024, Def. 7)


@dataclass
class ModelConfig(Section):
    """A model: recipe section [model]. The planted_* fields describe a planted construction
    (probe/models/constructions/) and are 0 for the other families."""

    SECTION = "model"

    family: str = setting(
        "gpt2",
        "gpt2 (Garg et al.'s TransformerModel), lstm / lstm_residual (Fu et al. 2024, §3.3), lsa / lsa_sparse / lsa_mlp "
        "(linear self-attention) "
        "or planted",
        FAMILIES,
        noun="model family",
    )
    n_dims: int = setting(4, "d, the dimension of x")
    n_positions: int = setting(12, "number of (x, y) points; the GPT-2 context is twice this")
    n_embd: int = setting(32, "width of the residual stream / LSTM state (lsa: d + 1)")
    n_layer: int = setting(8, "transformer blocks or LSTM layers")
    n_head: int = setting(2, "attention heads (ignored by the LSTM)")
    encoding: str = setting(
        "garg", "garg: x, [y,0..0] (width d); akyurek: [0,x], [y,0..0] (width d+1)", ENCODINGS, noun="encoding"
    )
    planted: str = setting("", "family planted only: the construction its weights implement")
    planted_scale: float = setting(
        0.0, "planted only: GD / SGD / Adam step eta, Newton's alpha, or uniform's eps", low=None
    )
    planted_batch: int = setting(
        0, "planted sgd / adam only: minibatch size K (Hataya & Imaizumi 2024, Assumption 1)", minimum=0
    )
    planted_seed: int = setting(0, "planted sgd / adam only: seed of its minibatch masks (the learner's masks_seed)")
    planted_bound: float = setting(
        0.0, "planted sgd / adam only: R, the residual bound within which its gradient is exact", low=None
    )
    attn_activation: str = setting(
        "softmax",
        "gpt2 only: softmax, or relu (ReLU(q.k / sqrt(hs)) / #keys)",
        ATTENTION_ACTIVATIONS,
        noun="activation",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        FAMILIES.get(self.family).check_config(self)  # each family's own rules, in its module

    @property
    def token_dim(self) -> int:
        return self.n_dims + (1 if self.encoding == "akyurek" else 0)
