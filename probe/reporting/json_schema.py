"""summary.json's JSON Schema, generated from its dataclasses (probe/reporting/schema.py; the check
of a summary.json against the shipped copy, `check_summary`, stays there)."""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from .schema import ProbeFit, ProbeOrder, Probes, Summary

SCHEMA_ID = "https://icl-probe.example/summary.schema.json"


def json_schema() -> dict[str, Any]:
    """summary.json's JSON Schema (draft 2020-12), generated from the dataclasses of probe/reporting/schema.py: one
    definition per dataclass, its fields required unless they have a default; numbers may be
    null (a NaN or infinity is written as null, `strict`). summary.schema.json beside this module is this, written
    by `python -m probe.reporting.json_schema > probe/reporting/summary.schema.json` (shipped in the
    package and in the docs; a test keeps the file equal to this)."""
    defs: dict[str, Any] = {}
    root = _schema_of(Summary, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "icl-probe summary.json",
        "description": (Summary.__doc__ or "").strip(),
        **defs[root["$ref"].split("/")[-1]],
        "$defs": {name: body for name, body in sorted(defs.items()) if name != "Summary"},
    }


def _schema_of(kind: Any, defs: dict[str, Any]) -> dict[str, Any]:
    number = {"type": ["number", "null"]}
    if kind is Any:
        return {}
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        inner = _schema_of(args[0], defs) if len(args) == 1 else {"anyOf": [_schema_of(a, defs) for a in args]}
        return {"anyOf": [inner, {"type": "null"}]} if type(None) in get_args(kind) else inner
    if get_origin(kind) is list:
        items = get_args(kind)
        return {"type": "array", "items": _schema_of(items[0], defs)} if items else {"type": "array"}
    if get_origin(kind) is dict:
        return {"type": "object", "additionalProperties": _schema_of(get_args(kind)[1], defs)}
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
            defs[name] = _dataclass_schema(kind, defs)
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {kind!r}")


def _dataclass_schema(kind: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = get_type_hints(kind)
    if kind is Probes:  # targets as keys beside target_normalisation
        kinds = {"type": "object", "additionalProperties": _schema_of(ProbeFit, defs)}
        return {
            "type": "object",
            "description": (kind.__doc__ or "").strip(),
            "properties": {
                "target_normalisation": {"type": "string"},
                "order": {"type": "array", "items": _schema_of(ProbeOrder, defs)},
            },
            "required": ["target_normalisation"],
            "additionalProperties": kinds,
        }
    properties = {f.name: _schema_of(hints[f.name], defs) for f in fields(kind)}
    required = [f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING]
    out: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    out["additionalProperties"] = False
    if kind.__doc__ and not kind.__doc__.startswith(kind.__name__ + "("):
        out["description"] = " ".join(kind.__doc__.split())
    return out


if __name__ == "__main__":
    import sys

    json.dump(json_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
