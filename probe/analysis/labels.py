"""How reports name things: a sweep by its recipe title, a learner by its registered title, a
metric, target or null by LABELS (the report's findings and figures, and the analyses that draw
their own figures)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..learners import LEARNERS

LABELS = {
    "knn3": "3-NN",
    "sime": "SimE",
    "simw": "SimW",
    "xty": "X^T y",
    "w_ols": "w_OLS",
    "xtx": "S = X^T X / t",
    "random_model": "a random-weights model",
    "zero": "the zero predictor",
}

Titles = Mapping[str, str]  # sweep label -> its recipe title


def sweep_titles(sweeps: Iterable[Any]) -> dict[str, str]:
    """label -> title of the recipe entries that give one (SweepSettings, CompareSection or their
    dicts, as summary.json's recipe holds them)."""
    out = {}
    for s in sweeps:
        entry = s if isinstance(s, Mapping) else vars(s)
        if entry.get("title"):
            out[entry["label"]] = entry["title"]
    return out


def label(name: str, titles: Titles | None = None) -> str:
    """Human label of an internal name: a sweep by its recipe title (`titles`), a learner by its
    registered title, a metric, target or null by LABELS; a sweep of one grid value, `learner[k]`,
    reads "<learner>, k <unit>" (sgd[8]: "SGD, 8 steps")."""
    if titles and name in titles:
        return titles[name]
    fixed = re.fullmatch(r"(\w+)\[(\d+)\]", name)
    if fixed and name not in LABELS:
        learner, k = fixed.groups()
        unit = LEARNERS.get(learner).unit if learner in LEARNERS else "iterations"
        return f"{label(learner, titles)}, {k} {unit}"
    if name in LABELS:
        return LABELS[name]
    return LEARNERS.get(name).title if name in LEARNERS else name.replace("_", " ")


def layer_list(layers: list) -> str:
    """ "layer 3" or "layers 1, 2, 4": layers named in a sentence."""
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))
