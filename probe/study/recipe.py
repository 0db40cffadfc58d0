"""Study recipes: which checkpoints, which per-model analyses, and how to draw them.

    name, description
    checkpoints = ["checkpoints/depth-noisy/L*"]   paths or globs (sorted), or
    run = "checkpoints/gpt2-default-dynamics"      a run directory: its snapshots in step order
    curriculum_stage = true                         each snapshot as the model of the curriculum stage
                                                    it was saved at (probe/io/curriculum_stage.py)
    analyses = ["evaluate", "heatmap", "spd_ilw"]  ANALYSES, or a report stage with study rows
    x = "n_layer"                                   the model field figures put on the x axis
    prompt_seeds = [0, 1, 2]                        each model once per prompt seed (x = "prompt_seed")
    report = "quick"                                the report recipe whose stages are reused
    set = { "prompts.test" = 256 }                  overrides of that report recipe
    [[compare]] label, learner, grid, pick         learners for spd_ilw ("pick = 'best'": the
                                                    grid setting with the lowest SPD per model)
    [[shifts]]  label, plus TaskConfig fields       task shifts for `evaluate` (Wu et al. 2024, App. G)

A lam of "bayes" in a ridge grid is sigma^2 / tau^2 of each model's own task (Akyurek et al. 2023, §4).
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.config import Section, from_dict, load_recipe, merge, nested_override, setting, to_dict
from ..core.errors import ConfigError
from ..core.registry import Registry, unknown_name_message
from ..data.config import TaskConfig
from ..learners import LEARNERS

MAX_MATCHES = 256  # paths one checkpoints pattern may match
ANALYSES = ("evaluate", "readout", "heatmap", "spd_ilw", "probes", "evidence")  # the study's own


class StudyAnalyses(Registry[str]):
    """The per-model analyses a study recipe may name: the study's own (ANALYSES) and every
    registered report stage with a `study_rows` hook (the spectral filter; plugins' stages), read
    when a recipe is checked, so that stages registered later count."""

    def __init__(self) -> None:
        super().__init__("analysis")

    def names(self) -> list[str]:
        return [*ANALYSES, *stage_analyses()]

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self):
        return iter(self.names())


def stage_analyses() -> dict[str, Any]:
    """Registered report stages a study can run as analyses (those with a `study_rows` hook)."""
    from ..core.stages import registered

    return {name: stage for name, stage in registered().items() if stage.overrides("study_rows")}


STUDY_ANALYSES = StudyAnalyses()
from ..core.resources import RECIPE_DIR as STUDY_DIR
from ..reporting.recipe import resolve_recipe


@dataclass
class CompareSection(Section):
    """A [[compare]] entry: a learner and its grid for spd_ilw."""

    SECTION = "compare"

    label: str = setting(dataclasses.MISSING, "how the figures name it")
    learner: str = setting(dataclasses.MISSING, "the learner (probe/learners)", LEARNERS, noun="learner")
    grid: dict[str, Any] = field(default_factory=dict)
    pick: str = setting("all", "all grid settings, or the best (lowest SPD) per model", ("all", "best"), noun="pick")
    title: str = setting("", "how the study names this comparison (default: its learner's title)")

    def __post_init__(self) -> None:
        super().__post_init__()
        grid = {k: v for k, v in self.grid.items() if not (k == "lam" and v in (["bayes"], "bayes"))}
        LEARNERS.get(self.learner).check(grid, where=f"compare '{self.label}'")


# the model fields a study can put on its figures' x axis: the columns of study/analyses.py model_fields,
# and prompt_seed (a study with prompt_seeds, study/run.py study_units)
X_AXES = (
    "family",
    "n_layer",
    "n_embd",
    "n_head",
    "attn_activation",
    "n_dims",
    "n_points",
    "task",
    "noise_std",
    "relu_depth",
    "train_step",
    "train_seed",
    "prompt_seed",
    "format",
)


@dataclass
class StudyRecipe(Section):
    """A study recipe (the module docstring); its keys are checked as "study.<key>"."""

    SECTION = "study"

    name: str = setting("study", "the study's name (default: the recipe file's)")
    description: str = setting("", "one line on what the study shows")
    checkpoints: tuple[str, ...] = setting((), "checkpoint paths or globs (sorted)")
    run: str = setting("", "a run directory whose snapshots, in step order, are the models")
    curriculum_stage: bool = setting(
        False, "analyse each snapshot at the active d and points its curriculum had reached when it was saved"
    )
    analyses: tuple[str, ...] = setting(
        ("evaluate", "heatmap"), "per-model analyses", STUDY_ANALYSES, nonempty=True, noun="analysis"
    )
    x: str = setting("n_layer", "the model field figures put on the x axis", X_AXES, noun="axis")
    report: str = setting("quick", "the report recipe whose stages are reused")
    set: dict[str, Any] = field(default_factory=dict)  # overrides of the report recipe
    prompts: int = setting(256, "prompts for spd_ilw")
    queries: int = setting(0, "fresh queries per prefix for spd_ilw (0: 4 d)", minimum=0)
    evaluate_prompts: int = setting(1280, "prompts for the evaluate analysis")
    direct_epochs: int = setting(100, "ReLU tasks: epochs of the direct-training baseline")
    direct_prompts: int = setting(128, "ReLU tasks: prompts of the direct-training baseline")
    seed: int = setting(0, "seed of the study's prompt draws")
    prompt_seeds: tuple[int, ...] = setting(
        (),
        "analyse each model once per seed (its report's and the study's prompt draws): prompt-sample spread",
        minimum=0,
    )
    compare: list[CompareSection] = field(default_factory=list)
    shifts: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.compare = [
            c if isinstance(c, CompareSection) else from_dict(CompareSection, c, "compare") for c in self.compare
        ]
        if bool(self.checkpoints) == bool(self.run):
            raise ConfigError(
                "a study names its models with either `checkpoints` (paths or globs) or `run` "
                "(a run directory with snapshots), not both and not neither"
            )
        if self.x == "prompt_seed" and not self.prompt_seeds:
            raise ConfigError('x = "prompt_seed" needs prompt_seeds, e.g. prompt_seeds = [0, 1, 2]')
        if len(set(self.prompt_seeds)) != len(self.prompt_seeds):
            raise ConfigError(f"study.prompt_seeds repeats a seed: {list(self.prompt_seeds)}")
        if "spd_ilw" in self.analyses and not self.compare:
            raise ConfigError("analysis spd_ilw needs at least one [[compare]] learner")
        task_fields = [f.name for f in dataclasses.fields(TaskConfig)]
        for shift in self.shifts:
            if not isinstance(shift, dict) or not isinstance(shift.get("label"), str):
                raise ConfigError(
                    "each [[shifts]] entry needs a label and TaskConfig fields, e.g. "
                    "label = 'mix-0.9' with mixture_weights = [0.9, 0.1]"
                )
            for key in shift:
                if key != "label" and key not in task_fields:
                    raise ConfigError(
                        f"shift '{shift['label']}': " + unknown_name_message("task field", key, task_fields)
                    )

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def shifted_task(self, task: TaskConfig, shift: dict[str, Any]) -> TaskConfig:
        """A model's task with one [[shifts]] entry applied (TaskConfig checks the values)."""
        changes = {k: (tuple(v) if isinstance(v, list) else v) for k, v in shift.items() if k != "label"}
        try:
            return dataclasses.replace(task, **changes)  # type: ignore[arg-type]  # keys checked in __post_init__
        except ConfigError as err:
            raise ConfigError(f"shift '{shift['label']}': {err}") from None

    def report_recipe(self):
        """The report recipe whose stages (and stage cache) the per-model analyses reuse."""

        overrides = [nested_override(dotted, value) for dotted, value in self.set.items()]
        try:
            return resolve_recipe(self.report, overrides)
        except ConfigError as err:
            raise ConfigError(f"study report recipe {self.report!r} with set = {{...}}: {err}") from None


def resolve_study(name_or_path: str, overrides: list[dict[str, Any]] | None = None) -> StudyRecipe:
    path = Path(name_or_path)
    if not path.suffix:
        path = STUDY_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(
            p.stem for p in STUDY_DIR.glob("*.toml") if "checkpoints" in p.read_text() or "run =" in p.read_text()
        )
        raise ConfigError(unknown_name_message("study recipe", str(name_or_path), known) + " (or a path to a .toml)")
    data = load_recipe(path)
    data.setdefault("name", path.stem)
    for override in overrides or []:
        data = merge(data, override)
    return from_dict(StudyRecipe, data)


# what `icl-probe study CK1 CK2 ...` runs on each checkpoint when no study recipe is named
CHECKPOINT_ANALYSES = ("evaluate", "heatmap", "spectral", "evidence")


def varying_axis(fields: list[dict[str, Any]]) -> str:
    """The x axis for a set of models: n_dims where the dimension varies (the only axis a study of
    several d allows), else the first of X_AXES on which the models differ (family when none)."""
    differs = [axis for axis in X_AXES if len({repr(f.get(axis)) for f in fields}) > 1]
    if "n_dims" in differs:
        return "n_dims"
    return differs[0] if differs else "family"


def recipe_keys_help() -> str:
    """The study recipe's keys with their help lines (for `icl-probe study --help`)."""
    lines = []
    for f in dataclasses.fields(StudyRecipe):
        text = f.metadata.get("help") or {
            "set": 'overrides of the report recipe, e.g. { "prompts.test" = 512 }',
            "compare": "[[compare]] learners for spd_ilw: label, learner, grid, pick",
            "shifts": "[[shifts]] task shifts for evaluate: label plus TaskConfig fields",
        }.get(f.name, "")
        choices = f.metadata.get("choices")
        if choices is not None and f.name in ("analyses", "x"):
            text += f" ({', '.join(map(str, choices))})"
        lines.append(f"  {f.name:<17} {text}")
    return "\n".join(lines)


def snapshot_step(path: Path) -> int:
    match = re.fullmatch(r"step_(\d+)", path.name)
    return int(match.group(1)) if match else -1


def resolve_models(recipe: StudyRecipe, base: Path | None = None) -> list[Path]:
    """The study's checkpoint directories, in a stable order (globs sorted; snapshots by step)."""
    base = base or Path.cwd()
    if recipe.run:
        run = base / recipe.run
        snaps = sorted(
            (p for p in (run / "snapshots").glob("step_*") if p.is_dir() and snapshot_step(p) >= 0), key=snapshot_step
        )
        if not snaps:
            raise ConfigError(f"study run {run}: no snapshots/step_<k>/ directories; train it with --keep-every N")
        return snaps
    models: list[Path] = []
    for pattern in recipe.checkpoints:
        # bounded: a pattern such as "/*/*/*" must not walk the whole file system (or /proc)
        found = list(itertools.islice(glob.iglob(str(base / pattern)), MAX_MATCHES + 1))
        if len(found) > MAX_MATCHES:
            raise ConfigError(
                f"study checkpoints: {pattern!r} matches more than {MAX_MATCHES} paths; a study's models are one "
                "family of checkpoints, e.g. 'checkpoints/depth/L*'"
            )
        hits = sorted(Path(p) for p in found if Path(p).is_dir())
        if not hits:
            raise ConfigError(f"study checkpoints: {pattern!r} matches no directory (relative to {base})")
        models.extend(h for h in hits if h not in models)
    if not models:
        raise ConfigError("study checkpoints: the set of models is empty")
    return models
