"""summary.json's JSON Schema, generated from its dataclasses (probe/reporting/schema.py; the check
of a summary.json against the shipped copy, `check_summary`, stays there)."""

from __future__ import annotations

import json
from typing import Any

from .dataclass_schema import schema_of
from .schema import Summary

SCHEMA_ID = "https://icl-probe.example/summary.schema.json"


def json_schema() -> dict[str, Any]:
    """summary.json's JSON Schema (draft 2020-12), generated from the dataclasses of probe/reporting/schema.py: one
    definition per dataclass, its fields required unless they have a default; numbers may be
    null (a NaN or infinity is written as null, `strict`). summary.schema.json beside this module is this, written
    by `python -m probe.reporting.json_schema > probe/reporting/summary.schema.json` (shipped in the
    package and in the docs; a test keeps the file equal to this)."""
    defs: dict[str, Any] = {}
    root = schema_of(Summary, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "icl-probe summary.json",
        "description": (Summary.__doc__ or "").strip(),
        **defs[root["$ref"].split("/")[-1]],
        "$defs": {name: body for name, body in sorted(defs.items()) if name != "Summary"},
    }


if __name__ == "__main__":
    import sys

    json.dump(json_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
