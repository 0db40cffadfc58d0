"""`icl-probe report`: checkpoint -> stages (cached) -> figures, tables, summary.json, index.html.

The report is built in a temporary directory beside `out` and renamed into place only when
every stage has succeeded, so a failure never leaves half a report.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.forgetting import forgetting_table
from ..analysis.order import order_table
from ..analysis.pipeline import LayerSettings, analyse_layers, fit_readouts
from ..analysis.probe_study import probe_study
from ..analysis.readout import LayerReadouts
from ..checkpoint import LoadedCheckpoint
from ..errors import ConfigError
from ..evaluate import error_curve, plot_error_curve, r2_curve
from ..interventions.pipeline import layer_maps_from_best, run_interventions
from ..interventions.steer import steering_table
from ..memory import MemoryBudget
from ..outputs import OutputTarget, safe_name
from ..seeds import Stream, random_weights_model, stream_generator
from ..tasks import sample_prompts
from ..validate import check_memory
from . import figures
from . import intervention_figures as ifig
from .cache import StageCache, _jsonable
from .html import render_html
from .recipe import Recipe, adapt_recipe
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

    return LayerSettings(
        recipe.prompts,
        recipe.readout,
        recipe.similarity,
        tuple(recipe.sweeps),
        device=device,
        memory=memory or MemoryBudget(),
    )


def _stage_evaluate(ckpt: LoadedCheckpoint, recipe: Recipe, device: str):

    task = ckpt.config.task
    tables = {"icl_error": error_curve(ckpt.model, task, recipe.prompts.curve, recipe.prompts.seed, device=device)}
    if task.name == "relu_network":  # seed 001 App. G: R^2 beside direct training of the network
        tables["icl_r2"] = r2_curve(ckpt.model, task, recipe.prompts.curve, recipe.prompts.seed, device=device)
    return tables, {}


def _stage_layers(ckpt: LoadedCheckpoint, recipe: Recipe, device: str, progress: bool, memory: MemoryBudget):

    res = analyse_layers(ckpt.model, ckpt.config.task, layer_settings(recipe, device, memory), progress=progress)
    alphas = getattr(res.readouts, "alpha", None)
    return (
        {
            "readout": res.readout,
            "heatmap_cells": res.cells,
            "best_match": res.best,
            "table1": res.table1,
            "span": res.span,
            "nulls": res.nulls,
        },
        {
            "trends": res.trends,
            "readout_alpha": None if alphas is None else list(map(float, alphas)),
            "readouts": res.readouts.to_json() if isinstance(res.readouts, LayerReadouts) else None,
            "timings": res.timings,
        },
    )


def probe_control_model(ckpt: LoadedCheckpoint, seed: int):
    """The probes' random-weights control (probe/seeds.py)."""

    return random_weights_model(ckpt.config.model, seed)


def _stage_probes(ckpt: LoadedCheckpoint, recipe: Recipe, device: str, progress: bool, memory: MemoryBudget):

    settings, seed = recipe.probes, recipe.prompts.seed
    control = probe_control_model(ckpt, seed) if settings.controls else None
    task, n_test = ckpt.config.task, recipe.prompts.test
    table = probe_study(ckpt.model, task, settings, n_test, seed, device, control, progress, memory)
    return {"probes": table}, {}


def _stage_forgetting(ckpt: LoadedCheckpoint, recipe: Recipe, device: str, memory: MemoryBudget):

    p = sample_prompts(
        ckpt.config.task, recipe.forgetting.prompts, generator=stream_generator(recipe.prompts.seed, Stream.FORGETTING)
    )
    learners = {s.label: {"learner": s.learner, "grid": s.grid} for s in recipe.forgetting.learners}
    return {"forgetting": forgetting_table(ckpt.model, p.xs, p.ys, learners, device, memory)}, {}


def order_stage(
    ckpt: LoadedCheckpoint,
    recipe: Recipe,
    device: str,
    memory: MemoryBudget | None = None,
    fitted: dict[str, list] | None = None,
):
    """Order sensitivity of every layer and of the [order] learners; also `icl-probe order`. The
    layers' read-outs are the layers stage's (`fitted`, its "readouts" data), or refitted exactly
    as that stage fits them when it did not run."""

    settings, task = recipe.order, ckpt.config.task
    p = sample_prompts(task, settings.prompts, generator=stream_generator(recipe.prompts.seed, Stream.ORDER))
    if fitted is not None:
        readouts = LayerReadouts.from_json(fitted)
    else:
        readouts, _, _ = fit_readouts(ckpt.model, task, layer_settings(recipe, device, memory))
    learners = {s.label: {"learner": s.learner, "grid": s.grid} for s in settings.learners}
    prefixes = settings.prefixes_for(task.n_dims, task.n_points)
    table = order_table(
        ckpt.model, readouts, p.xs, p.ys, prefixes, settings.permutations, learners, recipe.prompts.seed, device, memory
    )
    return {"order": table}, {}


def steering_stage(ckpt: LoadedCheckpoint, recipe: Recipe, device: str):
    """Causal probes (probe/interventions/steer.py) at the [steering] cells; also `icl-probe steer`."""

    settings, task, seed = recipe.steering, ckpt.config.task, recipe.prompts.seed
    layers, prefixes = settings.cells(ckpt.config.model.n_layer, task.n_dims, task.n_points)
    train, test = (
        sample_prompts(task, size, generator=stream_generator(seed, stream))
        for size, stream in ((settings.train_prompts, Stream.STEER_TRAIN), (settings.test_prompts, Stream.STEER_TEST))
    )
    table = steering_table(
        ckpt.model,
        (train.xs, train.ys),
        (test.xs, test.ys),
        layers,
        prefixes,
        settings.targets,
        seed=seed,
        device=device,
    )
    return {"steering": table}, {}


INTERVENED_FAMILIES = ("gpt2", "planted")  # models with a TransformerLens form (probe/interventions/runner.py)


def _stage_interventions(ckpt: LoadedCheckpoint, recipe: Recipe, device: str, progress: bool, best: pd.DataFrame):

    iv = recipe.interventions
    labels = iv.learner_labels(recipe.sweeps)
    maps = layer_maps_from_best(best, [s for s in layer_settings(recipe, device).sweeps if s.label in labels])
    res = run_interventions(
        ckpt.model,
        ckpt.config.task,
        iv,
        layer_maps=maps,
        n_boot=recipe.similarity.bootstrap,
        seed=recipe.prompts.seed,
        device=device,
        progress=progress,
    )
    tables = {"ablation": res.ablation, "patching": res.patching}
    tables.update({f"iteration_{label}": frame for label, frame in res.iteration.items()})
    return {k: v for k, v in tables.items() if v is not None}, {"interventions": res.summary}


def check_report_size(ckpt: LoadedCheckpoint, recipe: Recipe) -> None:
    """Refuse a recipe whose captured activations would not fit in memory, naming the key."""

    m, n = ckpt.config.model, ckpt.config.task.n_points
    per_prompt = (m.n_layer + 2) * 2 * n * max(m.n_embd, 2 * m.n_dims + 2) * 4
    p = recipe.prompts
    for key, count in (
        ("prompts.train", p.train + p.val),
        ("prompts.test", p.test),
        ("prompts.curve", p.curve),
        ("probes.prompts", recipe.probes.prompts if recipe.probes.enabled else 0),
    ):
        check_memory(count * per_prompt, f"{key}={count} on {ckpt.name}", f"lower {key} (e.g. --set {key}=512)")
    queries = p.queries or 4 * m.n_dims
    if recipe.similarity.simw and queries < m.n_dims:
        raise ConfigError(
            f"prompts.queries = {queries} is fewer than d = {m.n_dims} on {ckpt.name}: a layer's induced weights "
            f"(seed 003 eq. 11) solve for d unknowns from the queries, so SimW needs queries >= d "
            f"(0 means 4 d; or --set similarity.simw=false)"
        )
    check_memory(
        min(p.induced, p.test) * n * queries * (m.n_layer + 1) * 8 * 2,
        f"prompts.induced={p.induced} with {queries} queries",
        "lower prompts.induced or prompts.queries",
    )


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
    """The recipe's stages (all, or those named in `only`), each through the stage cache, within
    the memory budget `memory` (which changes how work is chunked, never a number)."""
    built = Built()
    memory = memory or MemoryBudget()
    recipe = adapt_recipe(recipe, ckpt.config)
    sha = ckpt.fingerprint[:16]
    stages = [
        ("evaluate", ("prompts",), lambda: _stage_evaluate(ckpt, recipe, device)),
        (
            "layers",
            ("prompts", "readout", "similarity", "sweeps"),
            lambda: _stage_layers(ckpt, recipe, device, progress, memory),
        ),
    ]
    if recipe.probes.enabled or (only is not None and "probes" in only):
        stages.append(("probes", ("prompts", "probes"), lambda: _stage_probes(ckpt, recipe, device, progress, memory)))
    if recipe.forgetting.enabled:
        stages.append(
            ("forgetting", ("prompts", "forgetting"), lambda: _stage_forgetting(ckpt, recipe, device, memory))
        )
    if recipe.order.enabled:
        stages.append(
            (
                "order",
                ("prompts", "readout", "order"),
                lambda: order_stage(ckpt, recipe, device, memory, built.data.get(prefix + "readouts")),
            )
        )
    if recipe.steering.enabled and ckpt.config.model.family in INTERVENED_FAMILIES:
        stages.append(("steering", ("prompts", "steering"), lambda: steering_stage(ckpt, recipe, device)))
    if recipe.interventions.enabled and ckpt.config.model.family in INTERVENED_FAMILIES:
        stages.append(
            (
                "interventions",
                ("prompts", "readout", "similarity", "sweeps", "interventions"),
                lambda: _stage_interventions(ckpt, recipe, device, progress, built.tables[prefix + "best_match"]),
            )
        )
    for name, sections, fn in stages:
        if only is not None and name not in only:
            continue
        start = time.perf_counter()
        tables, data, hit = cache.get_or_run(f"{sha}-{name}-{recipe.digest(*sections)}", fn)
        built.timings[prefix + name] = round(time.perf_counter() - start, 2)
        built.cached[prefix + name] = hit
        built.tables.update({prefix + k: v for k, v in tables.items()})
        built.data.update({prefix + k: v for k, v in data.items()})
        log.info("stage %s done in %.1f s%s", prefix + name, built.timings[prefix + name], " (cached)" if hit else "")
    return built


def make_figures(
    built: Built, ckpt: LoadedCheckpoint, recipe: Recipe, fig_dir: Path, compare: LoadedCheckpoint | None = None
) -> dict[str, Path]:
    """Every figure of the report; returns name -> PNG path."""
    t = built.tables
    out: dict[str, Path] = {}
    out["icl_error"] = figures.icl_error(t["icl_error"], fig_dir / "icl_error", f"{ckpt.name}: error vs examples")[0]
    if "icl_r2" in t:
        fig_dir.mkdir(parents=True, exist_ok=True)
        plot_error_curve(t["icl_r2"], fig_dir / "icl_r2.png", f"{ckpt.name}: R^2 vs examples")
        out["icl_r2"] = fig_dir / "icl_r2.png"
    out["readout"] = figures.readout_error(t["readout"], fig_dir / "readout", ckpt.config.task.n_dims)[0]
    for sweep in recipe.sweeps:
        key = f"heatmap_{sweep.label}"
        out[key] = figures.heatmap_pair(
            t["heatmap_cells"], t["best_match"], sweep.label, sweep.axis, fig_dir / safe_name(key)
        )[0]
        if sweep.axis:
            key = f"trend_{sweep.label}"
            out[key] = figures.best_match_trend(t["best_match"], sweep.label, "sime", fig_dir / safe_name(key))[0]
    if not t["span"].empty:
        out["span"] = figures.span(t["span"], fig_dir / "span")[0]
    if "probes" in t:
        out["probes"] = figures.probes(t["probes"], fig_dir / "probes")[0]
    if "forgetting" in t:
        out["forgetting"] = figures.forgetting(t["forgetting"], fig_dir / "forgetting")[0]
    if "order" in t:
        out["order"] = figures.order_sensitivity(t["order"], fig_dir / "order")[0]
    if "steering" in t:
        out["steering"] = figures.steering(t["steering"], fig_dir / "steering")[0]
    if "ablation" in t:
        out["ablation"] = ifig.ablation(t["ablation"], fig_dir / "ablation")[0]
        for site in t["patching"].site.unique() if "patching" in t else ():
            out[f"patching_{site}"] = ifig.patching(t["patching"], site, fig_dir / f"patching_{site}")[0]
        iteration = {k.removeprefix("iteration_"): v for k, v in t.items() if k.startswith("iteration_")}
        if iteration:
            out["iteration_consistency"] = ifig.iteration_consistency(iteration, fig_dir / "iteration_consistency")[0]
    if "compare_readout" in t:
        out["compare_readout"] = figures.readout_comparison(
            {ckpt.name: t["readout"], compare.name if compare else "compare": t["compare_readout"]},
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
    (probe.outputs): checked before any work, built in a private staging directory."""

    target = (
        out
        if isinstance(out, OutputTarget)
        else OutputTarget(Path(out), "report", force=force, inputs=(ckpt.path,) + ((compare.path,) if compare else ()))
    )
    check_report_size(ckpt, recipe)
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
        (tmp / "summary.json").write_text(json.dumps(summary.to_json(), indent=2, default=_jsonable) + "\n")
        (tmp / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
        (tmp / "index.html").write_text(render_html(built, summary, figs, ckpt, recipe, compare))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target.publish(tmp, {"checkpoint": ckpt.name, "recipe": recipe.name})
