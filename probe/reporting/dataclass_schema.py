"""JSON Schema (draft 2020-12) of a dataclass, field by field: what summary.json's schema is
generated from (probe/reporting/json_schema.py) and what `check_summary` adds for the blocks of
registered analyses (probe/core/stages.py)."""

from __future__ import annotations

import types
from dataclasses import fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from ..core.stages import by_block_key, required_fields

STAGE_BLOCKS = {"stage_blocks": True}  # field metadata: a dict of the registered stages' blocks, each as its `entries`


def schema_of(kind: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The schema of a type (a $ref into `defs` for a dataclass, whose definition is added there)."""
    number = {"type": ["number", "null"]}
    if kind is Any:
        return {}
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        inner = schema_of(args[0], defs) if len(args) == 1 else {"anyOf": [schema_of(a, defs) for a in args]}
        return {"anyOf": [inner, {"type": "null"}]} if type(None) in get_args(kind) else inner
    if get_origin(kind) is list:
        items = get_args(kind)
        return {"type": "array", "items": schema_of(items[0], defs)} if items else {"type": "array"}
    if get_origin(kind) is dict:
        return {"type": "object", "additionalProperties": schema_of(get_args(kind)[1], defs)}
    simple: dict[Any, dict[str, Any]] = {
        bool: {"type": "boolean"},
        int: {"type": "integer"},
        float: number,
        str: {"type": "string"},
    }
    if kind in simple:
        return simple[kind]
    if kind is list:
        return {"type": "array"}
    if kind is dict:
        return {"type": "object"}
    if isinstance(kind, type) and is_dataclass(kind):
        name = kind.__name__
        if name not in defs:
            defs[name] = {}  # placeholder: recursion stops here
            defs[name] = dataclass_schema(kind, defs)
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {kind!r}")


def dataclass_schema(kind: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = get_type_hints(kind)
    if hasattr(kind, "json_schema_value"):  # a block written in its own layout (Probes), given schema_of
        return kind.json_schema_value(lambda inner: schema_of(inner, defs))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in fields(kind):
        if f.metadata.get("stage_blocks"):  # the registered analyses' blocks (those that always run: required)
            for stage in by_block_key().values():
                properties.update(block_properties(stage, defs))
                if stage.settings is None:  # a stage that runs in every report: its keys are required
                    required += stage.required_keys
        else:
            properties[f.name] = schema_of(hints[f.name], defs)
            required += required_fields(kind, f.name)
    out: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    out["additionalProperties"] = False
    if kind.__doc__ and not kind.__doc__.startswith(kind.__name__ + "("):
        out["description"] = " ".join(kind.__doc__.split())
    return out


def block_properties(stage: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The summary.json properties of a registered stage's block (its `entry_types`)."""
    return {key: schema_of(kind, defs) for key, kind in stage.entry_types().items()}
