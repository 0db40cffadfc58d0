"""Settings declared once: an analysis's settings dataclass is its recipe section, and the
command-line flags of the commands that run it are derived from the same fields.

    @dataclass
    class ProbeSettings:
        steps: int = setting(300, "the most Adam steps")

The field's name is the recipe key (`[probes] steps = 300`, `--set probes.steps=1000`) and,
with dashes, the flag (`--steps 1000`). `add_flags` builds the flags a command exposes, each
storing into `args` under "section.key"; `flag_overrides` turns the flags given into recipe
overrides. A flag, a recipe key and `--set` therefore set the same value, and its default is
written only in the dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Iterable, Mapping
from typing import Any


def setting(default: Any, help: str, choices: Iterable[Any] | None = None) -> Any:
    """A settings field: its default (copied per instance when mutable) and one line of help."""
    metadata = {"help": help, "choices": tuple(choices) if choices is not None else None}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _scalar(hint: Any) -> Any:
    """The element type behind tuple[X, ...], list[X] or X | None."""
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    if typing.get_origin(hint) in (tuple, list) or (args and typing.get_origin(hint) is not None):
        return _scalar(args[0]) if args else str
    return hint


def _is_sequence(hint: Any) -> bool:
    origins = {typing.get_origin(a) for a in (hint, *typing.get_args(hint))}
    return bool(origins & {tuple, list})


def add_flags(
    parser: argparse.ArgumentParser,
    section: str,
    cls: type,
    names: Iterable[str] | Mapping[str, str],
    note: str = "",
) -> None:
    """One flag per named field of settings class `cls` (recipe section `section`).

    names: field names, or {field name: flag name} to spell a flag differently (e.g.
    {"eval": "test-prompts"}). Values are stored as args."section.field" (None when not given);
    booleans get --x / --no-x."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    spelled = dict(names) if isinstance(names, Mapping) else {n: n.replace("_", "-") for n in names}
    for name, flag in spelled.items():
        field, hint = fields[name], hints[name]
        default = field_default(field)
        shown = " ".join(map(str, default)) if isinstance(default, (tuple, list)) else default
        kwargs: dict[str, Any] = {
            "dest": f"{section}.{name}",
            "default": None,
            "help": f"{field.metadata.get('help', '')}{note} (recipe: {section}.{name}; default {shown})",
        }
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _scalar(hint)
            kwargs["metavar"] = name.upper()
            if _is_sequence(hint):
                kwargs["nargs"] = "+"
            choices = field.metadata.get("choices")
            if choices:
                kwargs["choices"], kwargs["metavar"] = choices, None
        parser.add_argument(f"--{flag}", **kwargs)


def flag_overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The flags given (those stored as "section.key"), as recipe overrides."""
    out = []
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            section, key = dest.split(".", 1)
            out.append({section: {key: list(value) if isinstance(value, tuple) else value}})
    return out
