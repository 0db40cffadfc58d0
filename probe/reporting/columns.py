"""Tables as summary.json values: a DataFrame's columns as JSON lists (NaN as null, counts as integers)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pandas as pd

COUNTS = ("k", "k_low", "k_high", "layer", "n_examples", "gap")  # columns whose integral floats are counts


def column(frame: pd.DataFrame, name: str) -> list:
    """A column as a JSON list: NaN -> null, and integral counts (layers, steps) as integers."""
    out = []
    for v in frame[name].tolist():
        if isinstance(v, float) and np.isnan(v):
            v = None
        elif isinstance(v, float) and name in COUNTS and v.is_integer():
            v = int(v)
        out.append(v)
    return out


def columns(frame: pd.DataFrame, kind: type, **extra) -> Any:
    """A dataclass whose list fields are the frame's columns of the same names (JSON lists)."""
    names = [f.name for f in fields(kind) if f.name in frame and f.name not in extra]
    return kind(**{name: column(frame, name) for name in names}, **extra)


def int_if_integral(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def plain(value: Any) -> Any:
    """numpy scalars as Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value
