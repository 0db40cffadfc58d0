"""The configuration framework, and the run's training schedule.

Every configuration section is a dataclass whose fields are declared with `setting` (default,
one line of help, and the rules its values obey: choices, bounds, non-empty) and checked by
`Section` when made; `from_dict` builds one from a recipe table (unknown keys get a close-match
hint; a section's `RENAMED` old keys are accepted with a warning), `to_dict` writes it back, and
`parse_override` / `nested_override` / `merge` apply `--set section.key=value` overrides. Recipes
are TOML files whose tables are named after the sections; command-line flags override recipe
values, which override the defaults. The sections live with what owns their values: the model
(probe/models/config.py), the task (probe/data/config.py), the analyses (probe/core/settings.py),
a run (probe/io/run_config.py: model, task, and the training schedule below).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, RenamedSetting
from .parsing import load_toml
from .registry import Registry, unknown_name_message
from .validate import Rule, whole_number

_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)`, resolved once per class (every recipe, settings object and
    command-line parser reads them; resolving the string annotations is most of their cost).
    Callers must not change the returned dict."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def setting(
    default: Any,
    help: str,
    choices: Iterable[Any] | None = None,
    *,
    minimum: int | None = 1,
    low: float | None = 0.0,
    strict: bool = True,
    high: float | None = None,
    nonempty: bool = False,
    noun: str = "value",
) -> Any:
    """A settings field: its default (copied per instance when mutable; `dataclasses.MISSING`: a
    required field), one line of help, and the rules `Section` checks, declared here once:
    `choices` (each value one of them, named `noun` in the error; a `Registry` is read when a value
    is checked, so registrations made after this declaration count), the least value of an integer
    (`minimum`; None: any integer), the bounds of a float (finite, > `low` or >= `low` when not
    `strict`, <= `high`; None: unbounded), and whether a list may be empty."""
    metadata = {
        "help": help,
        "choices": choices if choices is None or isinstance(choices, (tuple, Registry)) else tuple(choices),
        "minimum": minimum,
        "low": low,
        "strict": strict,
        "high": high,
        "nonempty": nonempty,
        "noun": noun,
    }
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class Section:
    """Base of every configuration section: each field declared with `setting` is checked against its
    rules when the dataclass is made (integers and floats normalised, list fields become tuples; a
    scalar given for a list field is a list of one), and errors name the recipe key,
    "<SECTION>.<field>". Cross-field rules go in the subclass's `__post_init__`, after super()'s."""

    SECTION: typing.ClassVar[str]

    def __post_init__(self) -> None:
        hints = type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value, key, rules = getattr(self, f.name), f"{self.SECTION}.{f.name}", f.metadata
            if "help" not in rules or value is None:
                continue
            kind = scalar_type(hints[f.name])
            if is_sequence(hints[f.name]):
                value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
                if rules["nonempty"] and not value:
                    raise ConfigError(f"{key} is empty; give at least one value, or leave it out for the default")
                setattr(self, f.name, tuple(_check_value(item, kind, key, rules) for item in value))
            else:
                setattr(self, f.name, _check_value(value, kind, key, rules))


def _check_value(value: Any, kind: Any, key: str, rules: Mapping[str, Any]) -> Any:
    """One value against its field's rules; returns it normalised (2.0 -> 2 for an int, 1 -> 1.0 for a float)."""
    choices = rules["choices"]
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}: " + unknown_name_message(rules["noun"], str(value), list(map(str, choices))))
    if kind is int and key.split(".")[-1].endswith("seed"):
        return Rule("seed").check(value, key)
    if kind is int:
        return Rule("integer" if rules["minimum"] is None else "count", minimum=rules["minimum"] or 0).check(value, key)
    if kind is float:
        return Rule("number", low=rules["low"], strict=rules["strict"], high=rules["high"]).check(value, key)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def scalar_type(hint: Any) -> Any:
    """The element type behind tuple[X, ...], list[X] or X | None."""
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    if typing.get_origin(hint) in (tuple, list) or (args and typing.get_origin(hint) is not None):
        return scalar_type(args[0]) if args else str
    return hint


def is_sequence(hint: Any) -> bool:
    origins = {typing.get_origin(a) for a in (hint, *typing.get_args(hint))}
    return bool(origins & {tuple, list})


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
    hints = type_hints(cls)
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
    hints = type_hints(cls)
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
    if hint is int:
        return whole_number(value, where)  # the field's own rules (minimum, seed) run in its section
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


# ------------------------------------------------------------------ the training schedule

SCHEDULES = ("cosine", "linear", "constant")
LOSSES = ("every_prefix", "last")  # probe/training/train.py


@dataclass
class Stage(Section):
    """One curriculum schedule: value(step) = min(end, start + inc * (step // interval))."""

    SECTION = "curriculum"

    start: int = setting(dataclasses.MISSING, "the value at step 0")
    end: int = setting(dataclasses.MISSING, "the value it grows to")
    inc: int = setting(0, "growth per interval", minimum=0)
    interval: int = setting(1, "steps between increments")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start > self.end:
            raise ConfigError(f"curriculum stage needs start <= end, got start={self.start} end={self.end}")

    def at(self, step: int) -> int:
        return min(self.end, self.start + self.inc * (step // self.interval))


@dataclass
class CurriculumConfig:
    """Garg et al.'s curriculum; an unset stage means 'always the task's full size'."""

    dims: Stage | None = None
    points: Stage | None = None


@dataclass
class TrainConfig(Section):
    """How a model is trained: recipe section [train]."""

    SECTION = "train"

    steps: int = setting(2000, "optimizer steps")
    batch_size: int = setting(64, "prompts per step")
    lr: float = setting(
        1e-3, "peak learning rate of AdamW (at most 10: an update moves each weight by about lr)", high=10.0
    )
    weight_decay: float = setting(0.0, "AdamW's weight decay", low=0.0, strict=False)
    warmup_steps: int = setting(200, "linear warm-up steps", minimum=0)
    schedule: str = setting(
        "cosine", "decay after warm-up: cosine / linear to min_lr_ratio * lr, or constant", SCHEDULES
    )
    min_lr_ratio: float = setting(0.1, "the decay's floor as a fraction of lr", low=0.0, strict=False, high=1.0)
    grad_clip: float = setting(1.0, "max global gradient norm (0 disables clipping)", low=0.0, strict=False)
    loss: str = setting(
        "every_prefix",
        "every_prefix: squared error averaged over every prefix (Garg et al.); last: the last point's alone, "
        "a fixed number of examples (Zhang, Frei & Bartlett 2024)",
        LOSSES,
        noun="loss",
    )
    seed: int = setting(0, "seed of the initialisation and the training prompts")
    log_every: int = setting(10, "steps between log lines")
    eval_every: int = setting(250, "steps between evaluations")
    eval_prompts: int = setting(256, "prompts per evaluation")
    save_every: int = setting(250, "steps between checkpoints")
