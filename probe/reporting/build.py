"""`icl-probe report`: checkpoint -> stages (cached) -> figures, tables, summary.json, index.html.

The report is built in a temporary directory beside `out` and renamed into place only when
every stage has succeeded, so a failure never leaves half a report.
"""

from __future__ import annotations

import hashlib
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

from ..capture.stream_store import StreamStore
from ..core import budget
from ..core.allocator import release_free_memory
from ..core.memory import MemoryBudget
from ..core.provenance import display_path
from ..core.stages import AnalysisStage, StageTables, registered, with_needs
from ..io.checkpoint import LoadedCheckpoint
from ..io.outputs import OutputTarget
from .cache import StageCache, _jsonable
from .compare import comparison, unprefixed
from .evidence import evidence_frame
from .figure_pool import FigurePool
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
    not_measured: dict[str, str] = field(default_factory=dict)  # stage switched on -> why it cannot run here


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
    options: dict[str, Any] = field(default_factory=dict)  # a derived command's (probe/core/stages.py Command)
    streams: StreamStore = field(default_factory=StreamStore)  # the probe streams its stages share

    def before(self, name: str, kind: str = "tables") -> Any:
        """An earlier stage's table or data entry `name` (None when that stage did not run)."""
        return getattr(self.earlier, kind).get(self.prefix + name)


def report_estimates(ckpt: LoadedCheckpoint, recipe: Recipe, only: set[str] | None = None) -> list[budget.Estimate]:
    """Memory and work of every size knob of the recipe's stages (those named in `only`, when given)
    on this checkpoint (each stage's `estimates`, probe/core/budget.py), with the stages they need; a
    stage may refuse the recipe here (the layer analyses: SimW with fewer queries than d)."""
    out: list[budget.Estimate] = []
    only = with_needs(only)
    for declared in registered().values():
        chosen = only is None or declared.name in only
        wanted = chosen and declared.enabled(recipe) and not declared.refusal(ckpt)
        if wanted:
            out += declared.estimates(recipe, ckpt)
    return out


def check_report_size(ckpt: LoadedCheckpoint, recipe: Recipe, only: set[str] | None = None) -> None:
    """Refuse a recipe this machine cannot afford (memory or work of any knob of its stages, or of
    those in `only`, probe/core/budget.py) or that a stage refuses on this checkpoint, before any
    work; errors name the recipe key."""
    budget.check(report_estimates(ckpt, recipe, only), ckpt.name)


@dataclass(frozen=True)
class Stage:
    """A registered analysis (probe/core/stages.py) as the report runs it: Context -> (tables, the
    data a StageTables carries beside them); its figures keyed "<stage>/<figure>" where its page
    section is made of its description, tables and figures (the spine's, drawn by the template's
    macros, keep their own names)."""

    declared: AnalysisStage

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def sections(self) -> tuple[str, ...]:
        """The recipe sections it reads: [prompts], its `reads` and its own (its cache key)."""
        return ("prompts", *self.declared.reads, *((self.name,) if self.declared.settings is not None else ()))

    def wanted(self, recipe: Recipe, ckpt: LoadedCheckpoint, only: set[str] | None = None) -> bool:
        """Whether a report runs it: switched on (or named in `only`) and runnable on the model."""
        on = self.declared.enabled(recipe) if only is None else self.name in only
        return on and not self.declared.refusal(ckpt)

    def run(self, c: Context) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
        tables = self.declared.run(c)
        return dict(tables), dict(tables.data) if isinstance(tables, StageTables) else {}

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, c: Context) -> dict[str, Path]:
        return self.declared.draw(tables, fig_dir, c)


def report_stages() -> dict[str, Stage]:
    """Every stage a report can run, in running order (probe/core/stages.py `registered`)."""
    return {name: Stage(declared) for name, declared in registered().items()}


def run_stages(
    ckpt: LoadedCheckpoint,
    recipe: Recipe,
    device: str,
    cache: StageCache,
    progress: bool,
    prefix: str = "",
    only: set[str] | None = None,
    memory: MemoryBudget | None = None,
    on_done: Callable[[Stage, dict[str, pd.DataFrame]], None] | None = None,
    given: Built | None = None,
    options: dict[str, Any] | None = None,
) -> Built:
    """The recipe's stages (or those named in `only` and the stages they need, whether or not the
    recipe enables them), each through the stage cache, within the memory budget `memory` (which changes how work is chunked,
    never a number). A stage switched on that cannot run on this checkpoint (its `refuses`) is
    recorded in `not_measured` with the reason, and skipped. `on_done(stage, tables so far)` is
    called as each stage finishes (the report draws its figures then, figure_pool.py). A derived
    command's: `given`, what earlier stages would have made (then `only` runs as named, without the
    stages it needs), `options` (Context.options)."""
    recipe, only = adapt_recipe(recipe, ckpt.config), (only if given is not None else with_needs(only))
    earlier = given if given is not None else Built()
    stages, sha = report_stages(), ckpt.fingerprint[:16]
    keys = planned_keys(stages, recipe, ckpt, only, sha)
    readers = {
        name: stages[name].declared.probe_stream_sets(recipe, ckpt)
        for name, key in keys.items()
        if not cache.holds(key)
    }
    with StreamStore({name: sets for name, sets in readers.items() if sets}) as streams:
        context = Context(
            ckpt, recipe, device, progress, memory or MemoryBudget(), earlier, prefix, dict(options or {}), streams
        )
        _run_planned(stages, keys, context, cache, only, on_done)
    return context.earlier


def planned_keys(stages: dict[str, Stage], recipe: Recipe, ckpt: LoadedCheckpoint, only, sha: str) -> dict[str, str]:
    """The cache key of every stage that will run, in running order."""
    keys: dict[str, str] = {}
    for stage in stages.values():
        if stage.wanted(recipe, ckpt, only):
            keys[stage.name] = stage_key(sha, stage, recipe, keys)
    return keys


def _run_planned(stages: dict[str, Stage], keys: dict[str, str], context: Context, cache: StageCache, only, on_done):
    """`run_stages`' loop: each stage of `keys` through the cache, the others recorded as not measured."""
    built, recipe, prefix = context.earlier, context.recipe, context.prefix
    for stage in stages.values():
        if stage.name not in keys:
            on = stage.declared.enabled(recipe) if only is None else stage.name in only
            if on:
                built.not_measured[prefix + stage.name] = stage.declared.refusal(context.ckpt)
            continue
        start = time.perf_counter()
        key = keys[stage.name]
        tables, data, hit = cache.get_or_run(key, partial(stage.run, context))
        built.timings[prefix + stage.name] = round(time.perf_counter() - start, 2)
        built.cached[prefix + stage.name] = hit
        built.tables.update({prefix + k: v for k, v in tables.items()})
        built.data.update({prefix + k: v for k, v in data.items()})
        if on_done is not None:
            on_done(stage, built.tables)
        release_free_memory()  # the stage's freed temporaries leave the resident set before the next
        log.info(
            "stage %s done in %.1f s%s",
            prefix + stage.name,
            built.timings[prefix + stage.name],
            " (cached)" if hit else "",
        )


def stage_key(sha: str, stage: Stage, recipe: Recipe, earlier: dict[str, str]) -> str:
    """A stage's cache key: the checkpoint, its name, the recipe sections it reads and the keys of
    the stages it needs (a needed stage that did not run counts as absent)."""
    own = recipe.digest(*stage.sections)
    if stage.declared.needs:
        needed = json.dumps([earlier.get(name, "") for name in stage.declared.needs])
        own = hashlib.sha256(f"{own}{needed}".encode()).hexdigest()[:16]
    return f"{sha}-{stage.name}-{own}"


def data_files(built: Built) -> dict[str, Any]:
    """The data entries the stages that ran name in `files` (AnalysisStage), by file name: the
    report's and the compared checkpoint's (prefixed compare_)."""
    names = [prefix + name for stage in registered().values() for name in stage.files for prefix in ("", "compare_")]
    return {name: built.data[name] for name in names if name in built.data}


def make_figures(
    built: Built, ckpt: LoadedCheckpoint, recipe: Recipe, fig_dir: Path, compare: LoadedCheckpoint | None = None
) -> dict[str, Path]:
    """Every figure of the report, stage by stage; returns name -> PNG path."""
    context = Context(ckpt, recipe, earlier=built)
    out: dict[str, Path] = {}
    for stage in report_stages().values():
        if stage.name in built.timings:
            out.update(stage.figures(built.tables, fig_dir, context))
    return {**out, **comparison_figures(built, ckpt, fig_dir, compare)}


def comparison_figures(
    built: Built, ckpt: LoadedCheckpoint, fig_dir: Path, compare: LoadedCheckpoint | None
) -> dict[str, Path]:
    """`report --compare`'s figures: each stage's own (its `compare_figures`), from both checkpoints'
    tables."""
    theirs = unprefixed(built)
    if not theirs.tables:
        return {}
    mine, yours = StageTables(built.tables, built.data, ckpt), StageTables(theirs.tables, theirs.data, compare)
    out: dict[str, Path] = {}
    for stage in registered().values():
        out.update(stage.compare_figures(mine, yours, fig_dir))
    return out


def _write_data(built: Built, folder: Path) -> Path:
    """data/: every table as <name>.csv and the data entries the stages name in `files` as <name>.json."""
    data_dir = folder / "data"
    data_dir.mkdir()
    for name, frame in built.tables.items():
        frame.to_csv(data_dir / f"{name}.csv", index=False)
    for name, entry in data_files(built).items():
        (data_dir / f"{name}.json").write_text(json.dumps(entry, indent=2) + "\n")
    return data_dir


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
    adapted = adapt_recipe(recipe, ckpt.config)  # what the stages run, for figures, summary and methods
    tmp = target.stage()
    here = Context(ckpt, adapted)  # figures drawn in this process (probe/reporting/figure_pool.py)
    kept = None if cache.root is None else Path(cache.root) / "figures"  # the stages' PNGs beside them
    pool = FigurePool(tmp / "figures", ckpt, adapted, here, cache=kept)
    try:
        built = run_stages(ckpt, recipe, device, cache, progress, memory=memory, on_done=pool.submit)
        compared: dict[str, Any] = {}
        if compare is not None:  # the user's recipe, adapted to the compared checkpoint by run_stages
            other = run_stages(compare, recipe, device, cache, progress, prefix="compare_", memory=memory)
            side_by_side, compared = comparison(built, other, ckpt, compare, recipe, device)
            built.tables.update({**other.tables, **side_by_side})
            built.data.update(other.data)
            built.timings.update(other.timings)
            built.cached.update(other.cached)
        recipe = adapted
        data_dir = _write_data(built, tmp)
        here.earlier = built
        figs = pool.wait()
        start = time.perf_counter()
        figs.update(comparison_figures(built, ckpt, tmp / "figures", compare))
        built.timings["figures"] = round(pool.blocked + time.perf_counter() - start, 2)  # this process's share
        summary = build_summary(built, ckpt, recipe, compare)
        if summary.compare is not None:
            summary.compare.update(compared)
        if summary.evidence:
            evidence_frame(summary.evidence).to_csv(data_dir / "evidence.csv", index=False)
        plain = json.loads(json.dumps(summary.to_json(), default=_jsonable))  # numpy values as JSON ones
        (tmp / "summary.json").write_text(json.dumps(strict(plain), indent=2, allow_nan=False) + "\n")
        (tmp / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
        (tmp / "index.html").write_text(render_html(built, summary, figs, ckpt, recipe, compare))
    except BaseException:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record = {"checkpoint": ckpt.name, "checkpoint_path": display_path(ckpt.path), "recipe": recipe.name}
    return target.publish(tmp, {**record, **sources})
