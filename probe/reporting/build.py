"""`icl-probe report`: checkpoint -> stages (cached) -> figures, tables, summary.json, index.html.

The report is built in a temporary directory beside `out` and renamed into place only when
every stage has succeeded, so a failure never leaves half a report.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.evaluate import error_curve, plot_error_curve, r2_curve
from ..analysis.pipeline import LayerSettings, analyse_layers
from ..analysis.readout import LayerReadouts
from ..analysis.spectral import reference_families
from ..core import budget
from ..core.allocator import release_free_memory
from ..core.errors import ConfigError
from ..core.memory import MemoryBudget
from ..core.provenance import display_path
from ..core.settings import query_count
from ..core.stages import AnalysisStage, StageTables, registered
from ..io.checkpoint import LoadedCheckpoint
from ..io.outputs import OutputTarget, safe_name
from ..models.sizes import shape_of
from . import figures
from .cache import StageCache, _jsonable
from .evidence import evidence_frame
from .findings import sweep_titles
from .html import render_html
from .recipe import Recipe, adapt_recipe
from .schema import strict
from .summary import build_summary

log = logging.getLogger(__name__)


@dataclass
class Built:
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    cached: dict[str, bool] = field(default_factory=dict)


def layer_settings(recipe: Recipe, device: str, memory: MemoryBudget | None = None):
    """The layer analyses' settings: the recipe's own [prompts], [readout], [similarity] and sweeps."""

    return LayerSettings.from_recipe(recipe, device, memory)


@dataclass
class Context:
    """What a stage runs with: the checkpoint, the recipe adapted to it, and the outputs of the
    stages before it (`earlier`, a Built whose keys carry `prefix`)."""

    ckpt: LoadedCheckpoint
    recipe: Recipe
    device: str = "cpu"
    progress: bool = False
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    earlier: Built = field(default_factory=Built)
    prefix: str = ""

    def before(self, name: str, kind: str = "tables") -> Any:
        """An earlier stage's table or data entry `name` (None when that stage did not run)."""
        return getattr(self.earlier, kind).get(self.prefix + name)


def _stage_evaluate(c: Context):

    task, prompts = c.ckpt.config.task, c.recipe.prompts
    tables = {"icl_error": error_curve(c.ckpt.model, task, prompts.curve, prompts.seed, device=c.device)}
    if task.name == "relu_network":  # seed 001 App. G: R^2 beside direct training of the network
        tables["icl_r2"] = r2_curve(c.ckpt.model, task, prompts.curve, prompts.seed, device=c.device)
    return tables, {}


def _stage_layers(c: Context):

    settings = layer_settings(c.recipe, c.device, c.memory)
    res = analyse_layers(c.ckpt.model, c.ckpt.config.task, settings, progress=c.progress)
    alphas = getattr(res.readouts, "alpha", None)
    return (
        {
            "readout": res.readout,
            "heatmap_cells": res.cells,
            "best_match": res.best,
            "table1": res.table1,
            "span": res.span,
            "nulls": res.nulls,
            "verdicts": res.verdicts,
            **spectral_tables(res.spectral),
        },
        {
            "trends": res.trends,
            "readout_alpha": None if alphas is None else list(map(float, alphas)),
            "readouts": res.readouts.to_json() if isinstance(res.readouts, LayerReadouts) else None,
            "timings": res.timings,
            **({"spectral_counts": res.spectral.counts} if res.spectral is not None else {}),
        },
    )


def spectral_tables(spectral) -> dict[str, pd.DataFrame]:
    """The spectral instrument's tables, named as the report writes them (none when it did not run)."""
    if spectral is None:
        return {}
    names = ("curves", "layers", "summary", "references", "fits")
    return {f"spectral_{name}": getattr(spectral, name) for name in names}


def report_estimates(ckpt: LoadedCheckpoint, recipe: Recipe) -> list[budget.Estimate]:
    """Memory and work of every size knob of the recipe's enabled stages on this checkpoint (probe/core/budget.py)."""
    shape, n, p = shape_of(ckpt.config.model), ckpt.config.task.n_points, recipe.prompts
    out = [
        budget.prompt_estimate("prompts.curve", p.curve, shape, n),
        *budget.layer_estimates(shape, n, p, recipe.similarity, recipe.sweeps),
    ]
    if recipe.readout.method == "adam":
        out.append(budget.finetune_estimate(recipe.readout.finetune_steps, shape, p.train, n))
    if recipe.spectral.enabled and recipe.similarity.simw:
        members = sum(budget.grid_points(f) for f in reference_families(shape.d))
        n_spectral = min(p.induced, p.test)
        out.append(
            budget.spectral_estimate(
                recipe.spectral.bins, n_spectral, shape.layers + 1 + members, recipe.similarity.bootstrap
            )
        )
    for name, declared in registered().items():
        wanted = getattr(recipe, name).enabled and (declared.applies is None or declared.applies(ckpt))
        if wanted and declared.estimates is not None:
            out += declared.estimates(recipe, ckpt)
    return out


def check_report_size(ckpt: LoadedCheckpoint, recipe: Recipe) -> None:
    """Refuse a recipe this machine cannot afford (memory or work of any knob, probe/core/budget.py) or
    whose SimW would be underdetermined, before any work; errors name the recipe key."""

    m = ckpt.config.model
    queries = query_count(recipe.prompts.queries, m.n_dims)
    if recipe.similarity.simw and queries < m.n_dims:
        raise ConfigError(
            f"prompts.queries = {queries} is fewer than d = {m.n_dims} on {ckpt.name}: a layer's induced weights "
            f"(seed 003 eq. 11) solve for d unknowns from the queries, so SimW needs queries >= d "
            f"(0 means 4 d; or --set similarity.simw=false)"
        )
    budget.check(report_estimates(ckpt, recipe), ckpt.name)


@dataclass(frozen=True)
class Stage:
    """One analysis of a report, declared once: how it runs (Context -> tables, data), the figures
    it draws (tables, figure dir, Context -> name -> PNG path), the recipe sections it reads besides
    [prompts] and its own (together its cache key), whether its own section's `enabled` switches it
    (`optional`), and which checkpoints it
    applies to (`applies`; None: all). The registered analyses (probe/core/stages.py) run as such
    a Stage (`_registered`)."""

    name: str
    run: Callable[[Context], tuple[dict[str, pd.DataFrame], dict[str, Any]]]
    figures: Callable[[dict[str, pd.DataFrame], Path, Context], dict[str, Path]]
    reads: tuple[str, ...] = ()
    optional: bool = True
    applies: Callable[[LoadedCheckpoint], bool] | None = None

    @property
    def sections(self) -> tuple[str, ...]:
        return ("prompts", *self.reads, *((self.name,) if self.optional else ()))

    def wanted(self, recipe: Recipe, ckpt: LoadedCheckpoint, only: set[str] | None = None) -> bool:
        """Whether a report runs it: switched on (or named in `only`) and runnable on the model."""
        on = not self.optional or getattr(recipe, self.name).enabled if only is None else self.name in only
        return on and (self.applies is None or self.applies(ckpt))


def _evaluate_figures(t, fig_dir: Path, c: Context) -> dict[str, Path]:
    name = c.ckpt.name
    out = {"icl_error": figures.icl_error(t["icl_error"], fig_dir / "icl_error", f"{name}: error vs examples")[0]}
    if "icl_r2" in t:
        fig_dir.mkdir(parents=True, exist_ok=True)
        plot_error_curve(t["icl_r2"], fig_dir / "icl_r2.png", f"{name}: R^2 vs examples")
        out["icl_r2"] = fig_dir / "icl_r2.png"
    return out


def _layer_figures(t, fig_dir: Path, c: Context) -> dict[str, Path]:
    out = {"readout": figures.readout_error(t["readout"], fig_dir / "readout", c.ckpt.config.task.n_dims)[0]}
    titles = sweep_titles(c.recipe.sweeps)
    for sweep in c.recipe.sweeps:
        key = f"heatmap_{sweep.label}"
        out[key] = figures.heatmap_pair(
            t["heatmap_cells"], t["best_match"], sweep.label, sweep.axis, fig_dir / safe_name(key), titles=titles
        )[0]
        if sweep.axis:
            key = f"trend_{sweep.label}"
            out[key] = figures.best_match_trend(t["best_match"], sweep.label, "sime", fig_dir / safe_name(key), titles)[
                0
            ]
    if not t["span"].empty:
        out["span"] = figures.span(t["span"], fig_dir / "span")[0]
    if "spectral_curves" in t:
        for variable in t["spectral_curves"].variable.unique():
            key = f"spectral_{variable}"
            out[key] = figures.spectral_curves(t["spectral_curves"], variable, fig_dir / key)[0]
        out["spectral_exponents"] = figures.spectral_exponents(t["spectral_layers"], fig_dir / "spectral_exponents")[0]
    return out


LAYER_SECTIONS = ("readout", "similarity", "sweeps", "spectral")
BUILTIN_STAGES = {
    stage.name: stage
    for stage in (
        Stage("evaluate", _stage_evaluate, _evaluate_figures, optional=False),
        Stage("layers", _stage_layers, _layer_figures, LAYER_SECTIONS, optional=False),
    )
}


def _registered(declared: AnalysisStage) -> Stage:
    """A registered analysis (probe/core/stages.py) as a report stage: its tables and the data a
    StageTables carries beside them; its figures keyed "<stage>/<figure>" (the page shows them in its
    section)."""
    draw, name = declared.figures, declared.name

    def run(c: Context) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
        tables = declared.run(c)
        return dict(tables), dict(tables.data) if isinstance(tables, StageTables) else {}

    return Stage(
        name,
        run,
        lambda t, fig_dir, c: {f"{name}/{k}": v for k, v in draw(t, fig_dir, c.recipe).items()} if draw else {},
        declared.reads,
        applies=declared.applies,
    )


def report_stages() -> dict[str, Stage]:
    """Every stage a report can run, in running order: the built-in ones, then the registered
    analyses (probe/core/stages.py) in the order they were registered."""
    return {**BUILTIN_STAGES, **{name: _registered(declared) for name, declared in registered().items()}}


def run_stages(
    ckpt: LoadedCheckpoint,
    recipe: Recipe,
    device: str,
    cache: StageCache,
    progress: bool,
    prefix: str = "",
    only: set[str] | None = None,
    memory: MemoryBudget | None = None,
) -> Built:
    """The recipe's stages (or those named in `only`, whether or not the recipe enables them), each
    through the stage cache, within the memory budget `memory` (which changes how work is chunked,
    never a number). Stages a model family cannot run are left out either way."""
    recipe = adapt_recipe(recipe, ckpt.config)
    context = Context(ckpt, recipe, device, progress, memory or MemoryBudget(), Built(), prefix)
    built, sha = context.earlier, ckpt.fingerprint[:16]
    for stage in report_stages().values():
        if not stage.wanted(recipe, ckpt, only):
            continue
        start = time.perf_counter()
        key = f"{sha}-{stage.name}-{recipe.digest(*stage.sections)}"
        tables, data, hit = cache.get_or_run(key, partial(stage.run, context))
        built.timings[prefix + stage.name] = round(time.perf_counter() - start, 2)
        built.cached[prefix + stage.name] = hit
        built.tables.update({prefix + k: v for k, v in tables.items()})
        built.data.update({prefix + k: v for k, v in data.items()})
        release_free_memory()  # the stage's freed temporaries leave the resident set before the next
        log.info(
            "stage %s done in %.1f s%s",
            prefix + stage.name,
            built.timings[prefix + stage.name],
            " (cached)" if hit else "",
        )
    return built


def make_figures(
    built: Built, ckpt: LoadedCheckpoint, recipe: Recipe, fig_dir: Path, compare: LoadedCheckpoint | None = None
) -> dict[str, Path]:
    """Every figure of the report, stage by stage; returns name -> PNG path."""
    context = Context(ckpt, recipe, earlier=built)
    out: dict[str, Path] = {}
    for stage in report_stages().values():
        if stage.name in built.timings:
            out.update(stage.figures(built.tables, fig_dir, context))
    if "compare_readout" in built.tables:
        out["compare_readout"] = figures.readout_comparison(
            {
                ckpt.name: built.tables["readout"],
                compare.name if compare else "compare": built.tables["compare_readout"],
            },
            fig_dir / "compare_readout",
        )[0]
    return out


def build_report(
    ckpt: LoadedCheckpoint,
    recipe: Recipe,
    out: Path | OutputTarget,
    device: str = "cpu",
    compare: LoadedCheckpoint | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
    force: bool = False,
    memory: MemoryBudget | None = None,
) -> Path:
    """Run the recipe's stages and publish the report into `out` under the output policy
    (probe.io.outputs): checked before any work, built in a private staging directory."""

    target = (
        out
        if isinstance(out, OutputTarget)
        else OutputTarget(Path(out), "report", force=force, inputs=(ckpt.path,) + ((compare.path,) if compare else ()))
    )
    check_report_size(ckpt, recipe)
    sources = {"fingerprint": ckpt.fingerprint, **({"compare_fingerprint": compare.fingerprint} if compare else {})}
    target.check_same_source(sources, display_path(ckpt.path))
    cache = StageCache(cache_dir)
    built = run_stages(ckpt, recipe, device, cache, progress, memory=memory)
    if compare is not None:  # the user's recipe, adapted to the compared checkpoint by run_stages
        other = run_stages(compare, recipe, device, cache, progress, prefix="compare_", memory=memory)
        built.tables.update(other.tables)
        built.data.update(other.data)
        built.timings.update(other.timings)
        built.cached.update(other.cached)
    recipe = adapt_recipe(recipe, ckpt.config)  # what the stages ran, for figures, summary and methods
    tmp = target.stage()
    try:
        start = time.perf_counter()
        data_dir = tmp / "data"
        data_dir.mkdir()
        for name, frame in built.tables.items():
            frame.to_csv(data_dir / f"{name}.csv", index=False)
        (data_dir / "trends.json").write_text(json.dumps(built.data.get("trends", []), indent=2) + "\n")
        figs = make_figures(built, ckpt, recipe, tmp / "figures", compare)
        built.timings["figures"] = round(time.perf_counter() - start, 2)
        summary = build_summary(built, ckpt, recipe, compare)
        if summary.evidence:
            evidence_frame(summary.evidence).to_csv(data_dir / "evidence.csv", index=False)
        plain = json.loads(json.dumps(summary.to_json(), default=_jsonable))  # numpy values as JSON ones
        (tmp / "summary.json").write_text(json.dumps(strict(plain), indent=2, allow_nan=False) + "\n")
        (tmp / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
        (tmp / "index.html").write_text(render_html(built, summary, figs, ckpt, recipe, compare))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record = {"checkpoint": ckpt.name, "checkpoint_path": display_path(ckpt.path), "recipe": recipe.name}
    return target.publish(tmp, {**record, **sources})
