"""The analyses' settings, and the command-line flags derived from them: an analysis's settings
dataclass (a `Section` of probe/core/config.py) is its recipe section, and the flags of the
commands that run it come from the same fields.

    @dataclass
    class ProbeSettings:   # probe/analysis/probe_study.py
        max_iter: int = setting(500, "the most L-BFGS iterations")

The field's name is the recipe key (`[probes] max_iter = 500`, `--set probes.max_iter=1000`) and,
with dashes, the flag (`--max-iter 1000`). `add_flags` builds the flags a command exposes, each
storing into `args` under "section.key"; `flag_overrides` turns the flags given into recipe
overrides. A flag, a recipe key and `--set` therefore set the same value, and the flag's and the
recipe's default is the dataclass's (a Python API function's own keyword default may repeat it).
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import typing
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config import Section, field_default, is_sequence, scalar_type, setting, type_hints
from .errors import ConfigError, RenamedSetting
from .resources import RECIPE_DIR
from .validate import check_bootstrap


def add_flags(
    parser: argparse.ArgumentParser,
    section: str,
    cls: type,
    names: Iterable[str] | Mapping[str, str | tuple[str, ...]],
) -> None:
    """One flag per named field of settings class `cls` (recipe section `section`).

    names: field names, or {field name: flag name} to spell a flag differently (e.g.
    {"test": "test-prompts"}, or a tuple whose later names are old spellings still accepted).
    Values are stored as args."section.field" (None when not given); booleans get --x / --no-x."""
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    spelled = dict(names) if isinstance(names, Mapping) else {n: n.replace("_", "-") for n in names}
    for name, spelling in spelled.items():
        flags = (spelling,) if isinstance(spelling, str) else tuple(spelling)
        field, hint = fields[name], hints[name]
        default = field_default(field)
        shown = " ".join(map(str, default)) if isinstance(default, (tuple, list)) else default
        kwargs: dict[str, Any] = {
            "dest": f"{section}.{name}",
            "default": None,
            "help": f"{field.metadata.get('help', '')} (default: the recipe's {section}.{name}; built in: {shown})",
        }
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kind = scalar_type(hint)
            kwargs["type"] = _checked_flag(kind, field.metadata, f"{section}.{name}")
            kwargs["metavar"] = {int: "N", float: "X"}.get(kind, "NAME")
            if is_sequence(hint):
                kwargs["nargs"] = "+"
            choices = field.metadata.get("choices")
            if choices:
                kwargs["choices"], kwargs["metavar"] = choices, None
        parser.add_argument(f"--{flags[0]}", **kwargs)
        for old in flags[1:]:  # old spellings: same value, a warning, not listed in --help
            parser.add_argument(f"--{old}", **{**kwargs, "help": argparse.SUPPRESS, "action": _renamed(flags[0])})


def _checked_flag(kind: type, rules: Mapping[str, Any], key: str):
    """argparse type of a flag setting recipe key `key`: the text as `kind`, checked against the
    field's rules when the command line is read, so that a bad value is refused naming the flag
    (argparse prefixes it) and the key it sets."""
    from .config import _check_value

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if "help" not in rules:
            return value
        try:
            return _check_value(value, kind, key, rules)
        except ConfigError as err:
            message = str(err).removeprefix(key).lstrip(": ")
            raise argparse.ArgumentTypeError(f"{message} (recipe key {key})") from None

    convert.__name__ = kind.__name__  # argparse names the type in its own messages
    return convert


def _renamed(new: str) -> type[argparse.Action]:
    """An argparse action storing like the flag --`new`, with a RenamedSetting warning."""

    class RenamedFlag(argparse._StoreAction):
        def __call__(self, parser, namespace, values, option_string=None):
            warnings.warn(
                f"{option_string} is now --{new}; the old name still works for now", RenamedSetting, stacklevel=2
            )
            super().__call__(parser, namespace, values, option_string)

    return RenamedFlag


def flag_overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The flags given (those stored as "section.key"), as recipe overrides."""
    out = []
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            section, key = dest.split(".", 1)
            out.append({section: {key: list(value) if isinstance(value, tuple) else value}})
    return out


# ------------------------------------------------------------------ the analyses' settings


def induced_count(induced: int, test: int) -> int:
    """Prompts whose induced weights are measured (SimW, the span test, the spectral instrument):
    the first `induced` of the `test` held-out prompts."""
    return min(induced, test)


def query_count(queries: int, d: int) -> int:
    """Fresh queries per prefix for a layer's induced weights (Fu et al. 2024, eq. 11-12): `queries`, or
    4 d where it is 0 (the recipes' default; SimW solves for d unknowns, so at least d are needed)."""
    return queries or 4 * d


def check_induced_queries(queries: int, d: int, key: str = "prompts.queries", where: str = "", off: str = "") -> int:
    """The query count (query_count), refused below d: a layer's induced weights (Fu et al. 2024, eq. 11)
    solve for d unknowns from the queries. `key` names the setting, `where` the checkpoint, `off`
    how to do without induced weights (e.g. "--set similarity.simw=false")."""
    count = query_count(queries, d)
    if count < d:
        on, alternative = f" on {where}" if where else "", f"; or {off}" if off else ""
        raise ConfigError(
            f"{key} = {queries} is fewer than d = {d}{on}: a layer's induced weights (Fu et al. 2024, eq. 11) solve for "
            f"d unknowns from the queries, so they need {key} >= d (0 means 4 d{alternative})"
        )
    return count


@dataclass
class PromptSettings(Section):
    """How many prompts each analysis draws, and the seed of every draw: recipe section [prompts].

    Renamed keys (the old name still works, with a warning): evaluate -> curve, eval -> test,
    simw -> induced."""

    SECTION = "prompts"
    RENAMED: typing.ClassVar[dict[str, str]] = {"evaluate": "curve", "eval": "test", "simw": "induced"}

    curve: int = setting(1280, "prompts for the error against the number of examples (Garg et al.'s 1280)")
    train: int = setting(1024, "prompts to fit the per-layer read-outs")
    val: int = setting(256, "prompts to choose the read-outs' ridge penalty")
    test: int = setting(256, "held-out test prompts for SimE, read-out errors and probe tests")
    induced: int = setting(64, "of the test prompts, those whose induced weights are compared (SimW, span test)")
    queries: int = setting(0, "fresh queries per prefix for the induced weights (0: 4 d)", minimum=0)
    seed: int = setting(0, "seed of every prompt draw", minimum=None)


@dataclass
class SimilaritySettings(Section):
    """Layer-vs-learner similarities (probe/analysis/similarity.py): recipe section [similarity]."""

    SECTION = "similarity"
    include_first: bool = setting(False, "SimE over positions 1..n (the paper's code) instead of 2..n")
    bootstrap: int = setting(500, "bootstrap resamples for every interval")
    simw: bool = setting(True, "compute SimW (induced weights from fresh query forward passes; off: SimE only)")

    def __post_init__(self) -> None:

        super().__post_init__()
        check_bootstrap(self.bootstrap, "similarity.bootstrap")


@dataclass
class SweepSettings:
    """One learner and its hyper-parameter grid: a [[sweeps]] entry (one heatmap family) or a
    [[forgetting.learners]] entry. Checked against the learner registry by the recipe."""

    label: str
    learner: str
    axis: str | None = None
    grid: dict[str, Any] = dataclasses.field(default_factory=dict)
    title: str = ""  # how reports name the sweep (default: its learner's title), e.g. "GD (log grid)"


def quick_sweeps() -> tuple[SweepSettings, ...]:
    """The quick recipe's [[sweeps]] (analyses/quick.toml): what `LayerSettings()` compares layers
    with when given no sweeps, so the Python API's default and the default report agree."""

    tables = tomllib.loads((RECIPE_DIR / "quick.toml").read_text(encoding="utf-8"))["sweeps"]
    return tuple(SweepSettings(**table) for table in tables)


def _flag_value(text: str, rule, expected: str):
    """argparse type: the text as an integer, then probe/core/validate.py's `rule` for it (one rule
    for a flag, a recipe key and an API argument); a fault reads "expected <expected>, got <text>"."""
    try:
        return rule(int(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int_flag(text: str) -> int:
    """argparse type of a count flag: an integer >= 1."""
    from .validate import positive_int as rule

    return _flag_value(text, lambda value: rule(value, "value"), "a positive integer")


def seed_flag(text: str) -> int:
    """argparse type of a --seed flag: an integer in 0..2^63-1."""
    from .validate import check_seed

    return _flag_value(text, check_seed, "a seed, an integer in 0..2^63-1")
