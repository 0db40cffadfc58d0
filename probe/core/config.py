"""Run configuration: dataclasses that validate themselves and round-trip through dicts.

A run is a model, a task, a curriculum and a training schedule. Recipes are TOML files whose
tables are named after the fields of `RunConfig` (`[model]`, `[task]`, `[train]`,
`[curriculum]`); command-line flags override recipe values, which override these defaults.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, RenamedSetting
from .parsing import load_toml
from .registry import unknown_name_message
from .validate import check_seed

MODEL_FAMILIES = ("gpt2", "lstm", "planted")
PLANTED_ALGORITHMS = ("gd", "newton", "newton-relu", "sgd", "adam", "uniform", "prng")  # probe/models/planted.py
ENCODINGS = ("garg", "akyurek")
ATTENTION_ACTIVATIONS = ("softmax", "relu")  # GPT-2 attention weights: softmax, or ReLU / #keys (seed 001 Def. 7)
TASKS = ("linear_regression", "sparse_linear_regression", "relu_network")
COVARIANCES = ("isotropic", "ill_conditioned")
SCHEDULES = ("cosine", "linear", "constant")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_numbers(obj: Any, section: str) -> None:
    """Every float field finite, every int field an int (not a bool, not a float)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.type in ("float", float):
            _check(
                isinstance(value, (int, float)) and not isinstance(value, bool),
                f"{section}.{f.name} must be a number, got {value!r}",
            )
            _check(math.isfinite(value), f"{section}.{f.name} must be a finite number, got {value!r}")
        elif f.type in ("int", int):
            _check(
                isinstance(value, int) and not isinstance(value, bool),
                f"{section}.{f.name} must be an integer, got {value!r}",
            )
            if f.name.endswith("seed"):
                check_seed(value, f"{section}.{f.name}")


def _check_choice(section: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{section}.{name}: " + unknown_name_message(name, value, list(choices)))


@dataclass
class ModelConfig:
    family: str = "gpt2"  # "gpt2" (Garg et al.'s TransformerModel) or "lstm" (seed 003 §3.3)
    n_dims: int = 4  # d, the dimension of x
    n_positions: int = 12  # number of (x, y) points; the GPT-2 context is twice this
    n_embd: int = 32  # width of the residual stream / LSTM state
    n_layer: int = 8  # transformer blocks or LSTM layers
    n_head: int = 2  # attention heads (ignored by the LSTM)
    encoding: str = "garg"  # "garg": x, [y,0..0] (width d); "akyurek": [0,x], [y,0..0] (width d+1)
    planted: str = ""  # family "planted" only: the construction its weights implement (gd, newton, newton-relu)
    planted_scale: float = 0.0  # family "planted" only: GD / SGD step eta, Newton's fixed alpha, or uniform's eps
    planted_batch: int = 0  # planted "sgd" only: minibatch size K (seed 000 Assumption 1)
    planted_seed: int = 0  # planted "sgd" only: seed of its minibatch masks (the learner's masks_seed)
    planted_bound: float = 0.0  # planted "sgd" only: R, the residual bound within which its gradient is exact
    attn_activation: str = "softmax"  # family "gpt2" only: "softmax", or "relu" (ReLU(q.k / sqrt(hs)) / #keys)

    def __post_init__(self) -> None:
        _check_numbers(self, "model")
        _check_choice("model", "family", self.family, MODEL_FAMILIES)
        _check_choice("model", "encoding", self.encoding, ENCODINGS)
        _check_choice("model", "attn_activation", self.attn_activation, ATTENTION_ACTIVATIONS)
        _check(
            self.family == "gpt2" or self.attn_activation == "softmax",
            f"model.attn_activation applies to the gpt2 family only; remove it for a {self.family} model",
        )
        for name in ("n_dims", "n_positions", "n_embd", "n_layer", "n_head"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"model.{name} must be a positive integer, got {value!r}")
        _check(
            self.family != "planted" or self.planted in PLANTED_ALGORITHMS,
            f"model.planted must be one of {', '.join(PLANTED_ALGORITHMS)} for a planted model, got {self.planted!r}",
        )
        _check(
            self.family != "gpt2" or self.n_embd % self.n_head == 0,
            f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})",
        )

    @property
    def token_dim(self) -> int:
        return self.n_dims + (1 if self.encoding == "akyurek" else 0)


@dataclass
class TaskConfig:
    name: str = "linear_regression"  # see probe.data.tasks.TASKS
    n_dims: int = 4  # d
    n_points: int = 12  # examples per prompt
    w_scale: float = 1.0  # tau: w ~ N(0, tau^2 I)
    noise_std: float = 0.0  # sigma: y = x.w + N(0, sigma^2)
    covariance: str = "isotropic"  # x ~ N(0, I) or N(0, Sigma) with kappa(Sigma) = kappa
    kappa: float = 100.0  # condition number of Sigma when covariance = "ill_conditioned"
    sparsity: int = 2  # non-zero entries of w for sparse_linear_regression
    relu_depth: int = 3  # N, layers of the ReLU network (seed 001 Def. 1)
    relu_width: int = 16  # K, hidden width of the ReLU network
    mixture_weights: tuple[float, float] = (1.0, 0.0)  # x ~ w1 N(-m, I) + w2 N(m, I) (relu only)
    mixture_mean: float = 2.0  # m
    param_mean: float = 0.0  # network parameters ~ N(param_mean, 1) before 1/sqrt(fan_in)

    def __post_init__(self) -> None:
        _check_numbers(self, "task")
        _check_choice("task", "name", self.name, TASKS)
        _check_choice("task", "covariance", self.covariance, COVARIANCES)
        _check(self.n_dims >= 1, f"task.n_dims must be >= 1, got {self.n_dims}")
        _check(self.n_points >= 1, f"task.n_points must be >= 1, got {self.n_points}")
        _check(self.w_scale > 0, f"task.w_scale must be > 0, got {self.w_scale}")
        _check(self.noise_std >= 0, f"task.noise_std must be >= 0, got {self.noise_std}")
        _check(self.kappa >= 1, f"task.kappa must be >= 1, got {self.kappa}")
        _check(
            1 <= self.sparsity <= self.n_dims, f"task.sparsity must be in 1..n_dims={self.n_dims}, got {self.sparsity}"
        )
        _check(self.relu_depth >= 2, f"task.relu_depth must be >= 2, got {self.relu_depth}")
        _check(self.relu_width >= 1, f"task.relu_width must be >= 1, got {self.relu_width}")
        _check(
            all(isinstance(w, (int, float)) and math.isfinite(w) for w in self.mixture_weights),
            f"task.mixture_weights must be two finite numbers, got {self.mixture_weights}",
        )
        self.mixture_weights = tuple(float(w) for w in self.mixture_weights)  # type: ignore[assignment]  # length checked next
        _check(
            len(self.mixture_weights) == 2
            and min(self.mixture_weights) >= 0
            and abs(sum(self.mixture_weights) - 1) < 1e-6,
            f"task.mixture_weights must be two non-negative numbers summing to 1, got {self.mixture_weights}",
        )


@dataclass
class Stage:
    """One curriculum schedule: value(step) = min(end, start + inc * (step // interval))."""

    start: int
    end: int
    inc: int = 0
    interval: int = 1

    def __post_init__(self) -> None:
        _check(
            1 <= self.start <= self.end,
            f"curriculum stage needs 1 <= start <= end, got start={self.start} end={self.end}",
        )
        _check(
            self.inc >= 0 and self.interval >= 1,
            f"curriculum stage needs inc >= 0 and interval >= 1, got {self.inc}, {self.interval}",
        )

    def at(self, step: int) -> int:
        return min(self.end, self.start + self.inc * (step // self.interval))


@dataclass
class CurriculumConfig:
    """Garg et al.'s curriculum; an unset stage means 'always the task's full size'."""

    dims: Stage | None = None
    points: Stage | None = None


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3  # peak learning rate of AdamW
    weight_decay: float = 0.0
    warmup_steps: int = 200
    schedule: str = "cosine"  # decay after warm-up: cosine / linear to min_lr_ratio*lr, or constant
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm (0 disables clipping)
    seed: int = 0
    log_every: int = 10
    eval_every: int = 250
    eval_prompts: int = 256
    save_every: int = 250

    def __post_init__(self) -> None:
        _check_numbers(self, "train")
        _check_choice("train", "schedule", self.schedule, SCHEDULES)
        for name in ("steps", "batch_size", "log_every", "eval_every", "eval_prompts", "save_every"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"train.{name} must be a positive integer, got {value!r}")
        _check(self.lr > 0, f"train.lr must be > 0, got {self.lr}")
        _check(self.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(0 <= self.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.grad_clip >= 0, f"train.grad_clip must be >= 0, got {self.grad_clip}")
        _check(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def __post_init__(self) -> None:
        _check(
            self.model.n_dims == self.task.n_dims,
            f"model.n_dims ({self.model.n_dims}) must equal task.n_dims ({self.task.n_dims})",
        )
        _check(
            self.task.n_points <= self.model.n_positions,
            f"task.n_points ({self.task.n_points}) exceeds model.n_positions ({self.model.n_positions})",
        )
        c = self.curriculum
        _check(
            c.dims is None or c.dims.end <= self.task.n_dims,
            f"curriculum.dims.end must be <= task.n_dims ({self.task.n_dims})",
        )
        _check(
            c.points is None or c.points.end <= self.model.n_positions,
            f"curriculum.points.end must be <= model.n_positions ({self.model.n_positions})",
        )

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return from_dict(cls, data)


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict of JSON/TOML types (tuples become lists, None entries stay)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _rename_keys(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` with the old keys of `cls.RENAMED` (old -> new) under their new names, warning."""
    renamed = getattr(cls, "RENAMED", {})
    if not renamed or not set(data) & set(renamed):
        return data
    out = {}
    for key, value in data.items():
        new = renamed.get(key, key)
        if new != key:
            old_name, new_name = (f"{where}.{k}" if where else k for k in (key, new))
            if new in data:
                raise ConfigError(
                    f"{old_name} and {new_name} are both given; {old_name} is the old name, keep only {new_name}"
                )
            warnings.warn(
                f"{old_name} is now {new_name}; the old name still works for now", RenamedSetting, stacklevel=4
            )
        out[new] = value
    return out


def current_names(cls: type, data: Any, where: str = "") -> Any:
    """A (partial) table of dataclass `cls`, e.g. a recipe override, with renamed keys under their
    new names at every level, so that an old-name override replaces the new-name value."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in _rename_keys(cls, data, where).items():
        hint = hints.get(key)
        nested = [a for a in (*typing.get_args(hint), hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        out[key] = current_names(nested[0], value, f"{where}.{key}" if where else key) if nested else value
    return out


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a dict, rejecting unknown keys with a close-match hint (keys a
    settings class renamed are accepted under their old names, with a RenamedSetting warning)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__} must be a table/dict, got {type(data).__name__}")
    data = _rename_keys(cls, data, where)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            renamed = getattr(cls, "RENAMED", {})
            raise ConfigError(f"{where + ': ' if where else ''}" + unknown_name_message("key", key, known, renamed))
        kwargs[key] = _coerce(hints[key], value, f"{where}.{key}" if where else key)
    try:
        return cls(**kwargs)
    except TypeError as err:  # e.g. a missing required field of a Stage
        raise ConfigError(f"{where or cls.__name__}: {err}") from None


def _coerce(hint: Any, value: Any, where: str) -> Any:
    args = typing.get_args(hint)
    if value is None:
        return None
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    nested = [a for a in (args or (hint,)) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    if nested:
        return from_dict(nested[0], value, where)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if hint is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if typing.get_origin(hint) is tuple:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and args and args[0] in (int, float):
            value = [value]  # a single number where a list of numbers is expected (probes.lr = 1e-2)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(value)
    return value


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read a TOML recipe into a dict (validated later, when merged into a RunConfig)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Recipe file not found: {path}")

    try:
        return load_toml(path, ConfigError, "recipe")
    except OSError as err:
        raise ConfigError(f"Recipe {path} cannot be read: {err.strerror}") from None


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; values in `override` win."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """'train.lr=3e-4' -> {'train': {'lr': 3e-4}} (the value is parsed as a TOML value)."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like section.key=value, e.g. train.steps=500")
    dotted, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as gpt2
    return nested_override(dotted, value)


def nested_override(dotted: str, value: Any) -> dict[str, Any]:
    """('train.lr', 3e-4) -> {'train': {'lr': 3e-4}}: one override as the tables it sets."""
    out: dict[str, Any] = {}
    cursor = out
    keys = dotted.strip().split(".")
    for key in keys[:-1]:
        cursor = cursor.setdefault(key, {})
    cursor[keys[-1]] = value
    return out
