"""`report --compare`: what a report can say of two checkpoints side by side. Every model, of any
d or task: each one's evidence answers, and per layer (by index and by relative depth l / L) its
read-out error at its own 2d+1 examples with the 90% interval and its spectral verdict and exponent.
Where the two share a task (the same prompts fit both): the paired difference of their own
predictions' error, per number of examples, and of each pair of layers' read-out error at 2d+1
examples (layers paired by relative depth), each with its 90% interval over the same prompts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..analysis.paired_layers import paired_layer_difference
from ..analysis.pipeline import LayerSettings
from ..analysis.readout import LayerReadouts
from ..core.stages import StageTables, registered
from ..io.checkpoint import LoadedCheckpoint
from .recipe import Recipe, adapt_recipe

PREFIX = "compare_"


def shares_task(a: LoadedCheckpoint, b: LoadedCheckpoint) -> bool:
    """One task (function class, d, covariance, noise), whatever the prompt lengths the models take."""
    return a.config.task == dataclasses.replace(b.config.task, n_points=a.config.task.n_points)


def unprefixed(built, prefix: str = PREFIX):
    """The compared checkpoint's stages (keys `compare_<name>`) as a report of its own would hold them."""
    strip = lambda entries: {k[len(prefix) :]: v for k, v in entries.items() if k.startswith(prefix)}
    return dataclasses.replace(
        built,
        tables=strip(built.tables),
        data=strip(built.data),
        timings=strip(built.timings),
        cached=strip(built.cached),
        not_measured=strip(built.not_measured),
    )


def layer_rows(name: str, tables: dict[str, pd.DataFrame], d: int) -> list[dict[str, Any]]:
    """Per layer: its read-out error / d at 2d+1 examples with the interval, and its spectral reading."""
    readout = tables["readout"]
    at = readout[readout.n_examples == min(2 * d + 1, int(readout.n_examples.max()))].sort_values("layer")
    spectral = tables.get("spectral_summary")
    by_layer = {} if spectral is None else {int(r.predictor): r for r in spectral.itertuples()}
    top = int(at.layer.max())
    rows = []
    for r in at.itertuples():
        s = by_layer.get(int(r.layer))
        rows.append(
            {
                "model": name,
                "layer": int(r.layer),
                "relative depth": round(int(r.layer) / top, 3) if top else 0.0,
                "examples": int(r.n_examples),
                "read-out error / d": float(r.error),
                "ci_low": float(r.ci_low),
                "ci_high": float(r.ci_high),
                "spectral verdict": "" if s is None else s.verdict,
                "p": None if s is None else s.p,
                "p_low": None if s is None else s.p_low,
                "p_high": None if s is None else s.p_high,
            }
        )
    return rows


@dataclass
class CompareContext:
    """What a stage's `compare` hook is given beside the two models' tables."""

    recipe: Recipe  # the report's recipe (each model's stages ran it adapted to its checkpoint)
    device: str
    same_task: bool  # one task: the same prompts fit both models
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # the comparison's tables so far


def comparison(
    built, other_built, ckpt: LoadedCheckpoint, other: LoadedCheckpoint, recipe: Recipe, device: str
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The comparison's tables and what summary.json's `compare` adds: each model's evidence answers,
    whether they share a task, then what every stage that ran on both adds (its `compare` hook, in
    report order: the error curve's paired difference, the layers' table by relative depth)."""
    from .summary import build_summary

    theirs = unprefixed(other_built)
    their_summary = build_summary(theirs, other, adapt_recipe(recipe, other.config), None)
    context = CompareContext(recipe, device, shares_task(ckpt, other))
    extra: dict[str, Any] = {
        "same_task": context.same_task,
        "evidence": {q_key(q): q.answer_words for q in their_summary.evidence or []},
    }
    mine, yours = StageTables(built.tables, built.data, ckpt), StageTables(theirs.tables, theirs.data, other)
    for name, stage in registered().items():
        if name in built.timings and name in theirs.timings:
            tables, entries = stage.compare(mine, yours, context)
            context.tables.update(tables)
            extra.update(entries)
    return context.tables, extra


def paired_layers(mine, theirs, recipe: Recipe, device: str) -> pd.DataFrame:
    """Each pair of layers' read-out error at 2d+1 examples, paired over the layers analysis's test
    prompts (of the shorter of the two prompt lengths), with the two models' own read-outs (`mine`,
    `theirs`: StageTables with `.ckpt`)."""
    ckpt, other = mine.ckpt, theirs.ckpt
    n = min(ckpt.config.task.n_points, other.config.task.n_points)
    task = dataclasses.replace(ckpt.config.task, n_points=n)
    settings = LayerSettings.from_recipe(adapt_recipe(recipe, ckpt.config), device)
    fitted = lambda b: None if b.data.get("readouts") is None else LayerReadouts.from_json(b.data["readouts"])
    frame = paired_layer_difference(
        ckpt.model, fitted(mine), other.model, fitted(theirs), task, settings, min(2 * task.n_dims + 1, n - 1)
    )
    frame["lower"] = frame["lower"].map({"a": ckpt.name, "b": other.name})
    return frame.rename(columns={"error_a": f"error {ckpt.name}", "error_b": f"error {other.name}"})


def q_key(q) -> str:
    return f"{q.a} vs {q.b}"
