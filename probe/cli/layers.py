"""Arguments and outputs shared by the commands that run report stages (the derived commands of
probe/cli/stage.py, ablate, patch, resolution).

Their settings come from a report recipe (`--recipe`, default: quick), resolved exactly as
`icl-probe report` resolves it (`--set` overrides, planted-model adaptations), so a standalone
command and the report give the same numbers on the same checkpoint. A flag given explicitly
overrides the recipe's value.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import check_device


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="quick", help="report recipe whose settings are used (default: quick)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value")


def recipe_from_args(args: argparse.Namespace, ckpt):
    """The report recipe, with --set and then the settings flags (probe/core/settings.py) applied,
    adapted to the checkpoint as the report adapts it."""
    from ..core.config import parse_override
    from ..core.settings import flag_overrides
    from ..reporting.recipe import adapt_recipe, resolve_recipe

    overrides = [parse_override(s) for s in args.set] + flag_overrides(args)
    return adapt_recipe(resolve_recipe(args.recipe, overrides), ckpt.config)


def settings_from_args(
    args: argparse.Namespace,
    ckpt,
    labels: tuple[str, ...] | None = None,
    sweeps: tuple | None = None,
    similarity: dict | None = None,
):
    """LayerSettings exactly as the report's layers stage builds them; `labels` picks sweeps
    (or `sweeps` replaces them), `similarity` overrides [similarity] keys (e.g. simw=False)."""
    from dataclasses import replace

    from ..analysis.pipeline import LayerSettings
    from ..core.errors import ConfigError
    from ..core.registry import unknown_name_message

    settings = LayerSettings.from_recipe(recipe_from_args(args, ckpt), check_device(args.device))
    if labels is not None:
        known = {s.label: s for s in settings.sweeps}
        for name in labels:
            if name not in known:
                raise ConfigError(
                    unknown_name_message("learner sweep", name, list(known)) + f" (in recipe {args.recipe})"
                )
        sweeps = tuple(known[n] for n in labels)
    if sweeps is not None:
        settings = replace(settings, sweeps=sweeps)
    return replace(settings, similarity=replace(settings.similarity, **similarity)) if similarity else settings


def write_tables(out: Path, tables: dict, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    write_run(out, meta)


def write_run(out: Path, meta: dict) -> None:
    """run.json: what the command ran (`meta`) with its provenance (versions, git hash, time)."""
    from ..core.provenance import stamp

    (out / "run.json").write_text(json.dumps({**meta, **stamp()}, indent=2, default=str) + "\n")
