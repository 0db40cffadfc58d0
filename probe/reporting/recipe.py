"""Report recipes: TOML files in analyses/ saying what a report runs.

    [prompts]        PromptSettings        how many prompts each analysis draws, and the seed
    [readout]        ReadoutSettings       per-layer read-outs
    [similarity]     SimilaritySettings    SimE / SimW options, bootstrap size
    [[sweeps]]       SweepSettings         label, learner, axis, grid (one per heatmap family)

Every section is a settings class (probe/core/settings.py; [readout] beside its analysis,
probe/analysis/readout.py), where its keys, defaults and help are written once; the commands' flags
are derived from the same classes. The analyses registered as `AnalysisStage`s
(probe/core/stages.py) add their own sections, [<stage name>], after these:

    [spectral]       probe/stages/spectral.py       each layer's spectral filter (on SimW's induced weights)
    [interventions]  probe/stages/interventions.py  causal checks (transformers only)
    [probes]         probe/stages/probes.py         attention-pooled probes for X^T y and w
    [forgetting]     probe/stages/forgetting.py     forgetting curves and their comparison learners
    [order]          probe/stages/order.py          order sensitivity and its comparison learners
    [ood]            probe/stages/ood.py            which matched learner the model tracks under distribution shifts
    [token_probes]   probe/stages/token_probes.py   per-token probes for the state a learner keeps
    [steering]       probe/stages/steering.py       causal probes (steering along linear probes)

Flags override recipe values (`--set prompts.test=256`); the resolved recipe is written into
the report. Unknown keys and unknown learners fail before any heavy work.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..analysis.readout import ReadoutSettings
from ..core.config import current_names, from_dict, load_recipe, merge, to_dict
from ..core.errors import ConfigError
from ..core.registry import unknown_name_message
from ..core.resources import RECIPE_DIR
from ..core.settings import PromptSettings, SimilaritySettings, SweepSettings
from ..core.stages import RESERVED, registered
from ..learners import check_sweep
from ..models import family_class

SWEEP_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class Recipe:
    name: str = "quick"
    description: str = ""
    prompts: PromptSettings = field(default_factory=PromptSettings)
    readout: ReadoutSettings = field(default_factory=ReadoutSettings)
    similarity: SimilaritySettings = field(default_factory=SimilaritySettings)
    sweeps: list[SweepSettings] = field(default_factory=list)
    stages: dict[str, Any] = field(default_factory=lambda: registered_settings({}))  # registered stages' sections

    def __getattr__(self, name: str) -> Any:
        """A registered stage's section, as a built-in one: `recipe.<stage name>`."""
        stages = self.__dict__.get("stages") or {}
        if name in stages:
            return stages[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __post_init__(self) -> None:
        self.sweeps = [
            s if isinstance(s, SweepSettings) else from_dict(SweepSettings, s, "sweeps") for s in self.sweeps
        ]
        if not self.sweeps:
            raise ConfigError("a recipe needs at least one [[sweeps]] entry")
        labels = [s.label for s in self.sweeps]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"sweep labels must be unique, got {labels}")
        for s in self.sweeps:
            check_sweep(s, "sweep")
            if not SWEEP_LABEL.fullmatch(s.label):
                raise ConfigError(
                    f"sweep label {s.label!r} must be letters, digits, '_', '-' or '.' "
                    "(it names output files), e.g. gd_log"
                )
        self.check_stages()

    def check_stages(self) -> None:
        """The registered stages' checks of their sections against the rest of the recipe."""
        for stage in registered().values():
            if stage.name in self.stages:
                stage.check(self)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as TOML would hold it: registered stages' sections at the top level, after the
        built-in ones."""
        out = {f.name: to_dict(getattr(self, f.name)) for f in fields(self) if f.name != "stages"}
        return {**out, **{name: to_dict(settings) for name, settings in self.stages.items()}}

    def digest(self, *sections: str) -> str:
        """Hash of the named sections (all when none): the cache key of a stage."""
        data = self.to_dict()
        part = {k: data[k] for k in sections} if sections else data
        return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:16]


def adapt_recipe(recipe: Recipe, config) -> Recipe:
    """The recipe as it applies to a checkpoint of run config `config` (what the report runs).

    ReLU-network tasks compare layers with networks of the task's depth. Planted models are
    judged with their own read-out (retraining would rescale the planted
    predictor) and against their learner's exact hyper-parameter: GD sweeps get the planted step
    and every step count up to the depth; Newton sweeps the planted fixed alpha. A planted SGD
    (or Adam) model is also compared with its learner replaying its minibatch masks
    (`sgd_replay`, `adam_replay`) and with other draws (`sgd_other`, `adam_other`: masks of the
    another seed, as a user without the model's seed meets)."""

    m, task = config.model, config.task
    if task.name == "relu_network":  # direct training uses the task's own network depth
        recipe = copy.deepcopy(recipe)
        for sweep in recipe.sweeps:
            if sweep.learner == "relu_gd":
                sweep.grid = {**sweep.grid, "depth": task.relu_depth}
    return family_class(m.family).adapt_recipe(recipe, config)


def resolve_recipe(name_or_path: str | None, overrides: list[dict[str, Any]] | None = None) -> Recipe:
    """A recipe by name (analyses/<name>.toml) or path, with overrides applied and validated."""
    name_or_path = name_or_path or "quick"
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPE_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in RECIPE_DIR.glob("*.toml") if "[[sweeps]]" in p.read_text())
            raise ConfigError(unknown_name_message("recipe", name_or_path, known) + " (or pass a path to a .toml file)")
    data = current_names(Recipe, load_recipe(path))
    data.setdefault("name", path.stem)
    for override in overrides or []:
        data = merge(data, current_names(Recipe, override))
    return recipe_from_dict(data)


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    """A recipe from its TOML-shaped dict (`Recipe.to_dict`, a report's recipe.json), validated."""
    data = dict(data)
    if "stages" in data:
        raise ConfigError("a recipe has no [stages] section: a registered stage's section is [<stage name>]")
    own = {name for name, stage in registered().items() if stage.settings is not None}
    sections = {name: data.pop(name) for name in list(data) if name in own}
    recipe = from_dict(Recipe, data)
    recipe.stages = registered_settings(sections)
    recipe.check_stages()
    return recipe


def registered_settings(sections: dict[str, Any]) -> dict[str, Any]:
    """Each registered stage's settings from its recipe section (its defaults where absent)."""
    return {
        name: from_dict(stage.settings, sections.get(name, {}), name)
        for name, stage in registered().items()
        if stage.settings is not None
    }


RESERVED.update(f.name for f in fields(Recipe))
