"""The Python API's cache (`probe.analyse` / `probe.spectral` with `cache_dir`): the layers stage's
results stored as the report's stage cache stores them (probe/reporting/cache.py: CSV tables and
checksummed JSON, keyed by the checkpoint's fingerprint, the settings that change numbers and the
code that computes them), and read back into the objects the API returns."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.pipeline import LayerAnalysis, LayerSettings, ModelLens
from ..analysis.readout import LayerReadouts
from ..analysis.spectral import NotMeasured, SpectralAnalysis, spectral_tables
from .cache import StageCache

FRAMES = ("readout", "cells", "best", "table1", "span", "nulls", "verdicts")


def settings_key(kind: str, fingerprint: str, settings: LayerSettings) -> str:
    """The entry's name: what it computed, on which checkpoint, with which settings (how it ran,
    device and memory budget, is left out: it does not change the numbers)."""
    numbers = {
        f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name not in ("device", "memory")
    }
    text = json.dumps([kind, fingerprint, numbers], sort_keys=True, default=lambda v: getattr(v, "__dict__", str(v)))
    return f"api-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _text_columns(tables: dict[str, pd.DataFrame]) -> dict[str, list[str]]:
    """Each table's text columns: CSV reads an empty string back as NaN, so they are restored (`_restored`)."""
    return {
        name: [str(c) for c in frame.columns if pd.api.types.is_string_dtype(frame[c]) or frame[c].dtype == object]
        for name, frame in tables.items()
    }


def _restored(tables: dict[str, pd.DataFrame], data: dict[str, Any]) -> dict[str, pd.DataFrame]:
    out = {}
    for name, frame in tables.items():
        text = [c for c in data.get("text_columns", {}).get(name, []) if c in frame.columns]
        out[name] = frame.astype(dict.fromkeys(text, object)).fillna(dict.fromkeys(text, ""))
    return out


def _spectral_out(spectral: SpectralAnalysis | NotMeasured | None) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    data: dict[str, Any] = {"spectral_counts": spectral.counts} if isinstance(spectral, SpectralAnalysis) else {}
    if isinstance(spectral, NotMeasured):
        data["spectral_not_measured"] = dataclasses.asdict(spectral)
    return spectral_tables(spectral) if not isinstance(spectral, NotMeasured) else {}, data


def _spectral_in(tables: dict[str, pd.DataFrame], data: dict[str, Any]) -> SpectralAnalysis | NotMeasured | None:
    if "spectral_not_measured" in data:
        return NotMeasured(**data["spectral_not_measured"])
    if "spectral_summary" not in tables:
        return None
    names = ("curves", "layers", "summary", "references", "fits")
    return SpectralAnalysis(**{n: tables[f"spectral_{n}"] for n in names}, counts=data["spectral_counts"])


def cached_spectrum(cache_dir: Path, fingerprint: str, settings: LayerSettings, compute: Callable[[], Any]):
    """`compute()` (a SpectralAnalysis or NotMeasured), or the stored one of the same checkpoint and settings."""

    def run() -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
        tables, data = _spectral_out(compute())
        return tables, {**data, "text_columns": _text_columns(tables)}

    tables, data, _ = StageCache(Path(cache_dir)).get_or_run(settings_key("spectral", fingerprint, settings), run)
    return _spectral_in(_restored(tables, data), data)


def cached_layers(
    cache_dir: Path, fingerprint: str, settings: LayerSettings, model, compute: Callable[[], LayerAnalysis]
):
    """`compute()` (a LayerAnalysis), or the stored one of the same checkpoint and settings."""

    def run() -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
        res = compute()
        tables, data = _spectral_out(res.spectral)
        tables.update({name: getattr(res, name) for name in FRAMES})
        readouts = res.readouts.to_json() if isinstance(res.readouts, LayerReadouts) else None
        extra = {
            "trends": res.trends,
            "timings": res.timings,
            "readouts": readouts,
            "text_columns": _text_columns(tables),
        }
        return tables, {**data, **extra}

    tables, data, _ = StageCache(Path(cache_dir)).get_or_run(settings_key("layers", fingerprint, settings), run)
    tables = _restored(tables, data)
    readouts = LayerReadouts.from_json(data["readouts"]) if data["readouts"] is not None else ModelLens(model)
    frames = {name: tables[name] for name in FRAMES}
    return LayerAnalysis(
        readouts, **frames, trends=data["trends"], timings=data["timings"], spectral=_spectral_in(tables, data)
    )
