"""One model's analyses for a study, as tidy rows.

Columns: model, analysis, metric, learner, layer, n_examples, shift, value, ci_low, ci_high.
The report's stages (evaluate, layers, probes) run through the report's stage cache, so a
study and a report on the same checkpoint and recipe share results.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..analysis.evaluate import error_curve, r2_curve
from ..analysis.matching import learner_weights
from ..analysis.similarity import first_best, ilw, induced_weights, sime, spd
from ..analysis.states import query_predictions
from ..core.errors import ConfigError
from ..core.seeds import Stream, stream_generator
from ..core.settings import check_induced_queries
from ..data.tasks import sample_prompts
from ..io.checkpoint import LoadedCheckpoint
from ..io.curriculum_stage import at_curriculum_stage
from ..io.formats import load_checkpoint
from ..learners import run_learner
from ..learners.closed_form import bayes_lambda
from ..models import family_class
from ..reporting.build import run_stages
from ..reporting.cache import StageCache
from ..reporting.recipe import adapt_recipe
from .recipe import StudyRecipe, stage_analyses

COLUMNS = ["model", "analysis", "metric", "learner", "layer", "n_examples", "shift", "value", "ci_low", "ci_high"]


def _row(
    analysis: str,
    metric: str,
    value: float,
    learner: str = "",
    layer: int | None = None,
    n_examples: int | None = None,
    shift: str = "",
    ci_low: float = np.nan,
    ci_high: float = np.nan,
) -> dict:
    return {
        "analysis": analysis,
        "metric": metric,
        "learner": learner,
        "layer": -1 if layer is None else int(layer),
        "n_examples": -1 if n_examples is None else int(n_examples),
        "shift": shift,
        "value": float(value),
        "ci_low": float(ci_low),
        "ci_high": float(ci_high),
    }


def evaluate_rows(tables: dict[str, pd.DataFrame], task, shift: str = "") -> list[dict]:
    """Error / d (linear tasks) or R^2 (ReLU tasks) per number of examples, model and baselines."""
    rows = []
    frame = tables["icl_r2"] if "icl_r2" in tables else tables["icl_error"]
    metric = "r2" if "icl_r2" in tables else "error"

    def model_row(rec, name: str, n: int) -> dict:
        low, high = rec.get("model_lo", np.nan), rec.get("model_hi", np.nan)
        return _row("evaluate", name, rec["model"], "model", n_examples=n, shift=shift, ci_low=low, ci_high=high)

    for rec in frame.to_dict("records"):
        n = int(rec["n_examples"])
        rows.append(model_row(rec, metric, n))
        for name in ("least_squares", "direct", "knn3", "averaging"):
            if name in rec:
                rows.append(_row("evaluate", metric, rec[name], name, n_examples=n, shift=shift))
    at = 2 * task.n_dims + 1
    hit = frame[frame.n_examples == at]
    if not hit.empty:
        rows.append(model_row(hit.iloc[0], f"{metric}_at_2d1", at))
    return rows


def layer_rows(tables: dict[str, pd.DataFrame], analyses: Sequence[str], task) -> list[dict]:
    rows = []
    if "readout" in analyses:
        r = tables["readout"]
        for layer, part in r[r.n_examples >= 1].groupby("layer"):
            rows.append(_row("readout", "readout_error", part.error.mean(), layer=layer))
        at = r[r.n_examples == 2 * task.n_dims + 1]
        for rec in at.to_dict("records"):
            rows.append(
                _row(
                    "readout",
                    "readout_error_at_2d1",
                    rec["error"],
                    layer=rec["layer"],
                    n_examples=rec["n_examples"],
                    ci_low=rec["ci_low"],
                    ci_high=rec["ci_high"],
                )
            )
    if "heatmap" in analyses:
        # each best match twice: its grid value k and its similarity, each with its interval
        columns = {"best_k": ("k", "k_low", "k_high"), "best_similarity": ("similarity", "ci_low", "ci_high")}
        for rec in tables["best_match"].to_dict("records"):
            for name, (value, low, high) in columns.items():
                metric = f"{rec['metric']}_{name}"
                rows.append(
                    _row(
                        "heatmap",
                        metric,
                        rec[value],
                        rec["sweep"],
                        layer=rec["layer"],
                        ci_low=rec[low],
                        ci_high=rec[high],
                    )
                )
            # 1: the best match is the grid's last value, so the true match may lie beyond it
            rows.append(
                _row(
                    "heatmap",
                    f"{rec['metric']}_at_grid_end",
                    float(bool(rec["at_grid_end"])),
                    rec["sweep"],
                    layer=rec["layer"],
                )
            )
    return rows


def stage_rows(analyses, built, ckpt, path) -> list[dict]:
    """The rows of each analysis that is a report stage (its `study_rows` hook, probe/core/stages.py)."""
    from ..core.stages import StageTables

    rows: list[dict] = []
    for name, stage in stage_analyses().items():
        if name not in analyses:
            continue
        if name not in built.timings:
            why = built.not_measured.get(name) or f'switch it on in the study\'s [set] ("{name}.enabled" = true)'
            raise ConfigError(f"study analysis {name!r} did not run on {path}: {why}")
        for row in stage.study_rows(StageTables(built.tables, built.data, ckpt)):
            rows.append(_row(name, **row))
    return rows


SIDE_VALUE = 1.0  # an evidence row's value: +1 favours the question's first hypothesis, -1 the second, 0 neither


def evidence_rows(built, report, ckpt) -> list[dict]:
    """The evidence tables of the stages the study ran, as a report of the same recipe on this model
    writes them (the report's own summary, probe/reporting/summary.py `build_summary`: each stage's
    block and `evidence` rows): per question "<a>_vs_<b>", one row per instrument (learner = the
    instrument, value +1 where it favours a, -1 where it favours b, 0 where undecided) and the
    consolidated answer (learner "consolidated answer"). The causal map and order rows need the
    interventions and order stages, which a study does not run. The validity checks read the model's
    task, read-out and prompts (a row outside its domain does not count) and, where the study ran
    "evaluate", its error curve (a model that does not learn in context gets no answer)."""
    from ..reporting.summary import build_summary

    summary = build_summary(built, ckpt, report, None)
    rows = []
    for q in summary.evidence or []:
        side: dict[str | None, float] = {q.a: SIDE_VALUE, q.b: -SIDE_VALUE}
        metric = f"{q.a}_vs_{q.b}"
        for r in q.rows:
            rows.append(_row("evidence", metric, side.get(r.favours, 0.0), r.instrument))
        rows.append(_row("evidence", metric, side.get(q.answer, 0.0), "consolidated answer"))
    return rows


def probe_rows(table: pd.DataFrame) -> list[dict]:
    rows = []
    for (target, kind, control, layer), part in table.groupby(["target", "kind", "control", "layer"]):
        rows.append(
            _row(
                "probes",
                f"probe_r2_{target}_{kind}",
                part.r2.mean(),
                "model" if control == "none" else control,
                layer=layer,
            )
        )
    return rows


@torch.no_grad()
def resolve_grid(grid: dict[str, Any], task) -> dict[str, Any]:
    """lam = "bayes" -> sigma^2 / tau^2 of the model's task (Akyurek et al. 2023, §4)."""

    out = dict(grid)
    if out.get("lam") in (["bayes"], "bayes", ("bayes",)):
        if task.noise_std <= 0:
            raise ConfigError("lam = 'bayes' needs a noisy task (task.noise_std > 0); this model's task has none")
        out["lam"] = [bayes_lambda(task.noise_std, task.w_scale)]
    return out


def spd_ilw_rows(model, task, recipe, device: str) -> list[dict]:
    """SPD and ILW (Akyurek et al. 2023, eq. 13-15) and SimE (Fu et al. 2024, eq. 10) of the model's own
    predictions against each [[compare]] learner, on fresh queries per prefix."""

    prompts = sample_prompts(task, recipe.prompts, generator=stream_generator(recipe.seed, Stream.STUDY_PROMPTS))
    g = stream_generator(recipe.seed, Stream.STUDY_QUERIES)
    n_q = check_induced_queries(recipe.queries, task.n_dims, key="queries")  # ILW's induced weights
    queries = torch.randn(recipe.prompts, n_q, task.n_dims, generator=g)
    if "sigma_sqrt" in prompts.params:
        queries = queries @ prompts.params["sigma_sqrt"]
    qp = query_predictions(model, prompts.xs, prompts.ys, queries, device)  # (B, n, Q)
    with torch.no_grad():
        own = model.to(device)(prompts.xs.to(device), prompts.ys.to(device)).double().cpu()
    w_model = induced_weights(qp[None], queries)  # (1, B, n, d)
    rows = []
    for c in recipe.compare:
        result = run_learner(c.learner, prompts.xs, prompts.ys, queries, **resolve_grid(c.grid, task))
        w = learner_weights(result, queries).cpu()
        assert result.query_preds is not None  # queries were given
        values = {
            "spd": spd(qp[None], result.query_preds.cpu())[0],
            "ilw": ilw(w_model, w)[0],
            "sime": sime(own[None], result.preds.cpu(), prompts.ys.double())[0],
        }  # each (K, B)
        means = {k: v.mean(-1) for k, v in values.items()}
        picks = [int(first_best(-means["spd"]))] if c.pick == "best" else range(len(result.grid))
        for i in picks:
            label = c.label if (c.pick == "best" or len(result.grid) == 1) else f"{c.label}[{i}]"
            for metric, per_prompt in values.items():
                v = per_prompt[i].numpy()
                half = 1.645 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else np.nan
                rows.append(_row("spd_ilw", metric, v.mean(), label, ci_low=v.mean() - half, ci_high=v.mean() + half))
            if c.pick == "best":
                for key, value in result.grid[i].items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        rows.append(_row("spd_ilw", f"best_{key}", value, label))
    return rows


def report_stages_of(analyses) -> set[str]:
    """The report stages a study's per-model analyses run, without the stages they need (run_stages
    adds those: the spectral stage's induced weights and the read-outs they are read through); the
    evidence table reads the layers' and the spectral stage's verdicts."""
    stages = {name for name in analyses if name in stage_analyses()}  # run_stages adds the stages they need
    if "evaluate" in analyses:
        stages.add("evaluate")
    if "readout" in analyses:
        stages.add("readout")
    if {"heatmap", "evidence"} & set(analyses):
        stages.add("layers")
    if {"spectral", "evidence"} & set(analyses):
        stages.add("spectral")
    if "probes" in analyses:
        stages.add("probes")
    return stages


def load_study_model(path: str | Path, curriculum_stage: bool = False) -> LoadedCheckpoint:
    """A study's model: the checkpoint, or with `curriculum_stage` the snapshot as the model of the
    curriculum stage it was saved at."""
    ckpt = load_checkpoint(path)
    return at_curriculum_stage(ckpt) if curriculum_stage else ckpt


def analyse_model(path: str, recipe_data: dict, cache_dir: str | None, device: str = "cpu") -> pd.DataFrame:
    """Every analysis of the study recipe on one checkpoint; a picklable entry for executors."""

    recipe = StudyRecipe(**{**recipe_data, "compare": recipe_data.get("compare", [])})
    ckpt = load_study_model(path, recipe.curriculum_stage)
    task = ckpt.config.task
    report = adapt_recipe(recipe.report_recipe(), ckpt.config)
    report.prompts.curve = recipe.evaluate_prompts
    stages = report_stages_of(recipe.analyses)
    built = run_stages(ckpt, report, device, StageCache(Path(cache_dir) if cache_dir else None), False, only=stages)
    rows: list[dict] = []
    if "evaluate" in recipe.analyses:
        rows += evaluate_rows(built.tables, task)
        for shift in recipe.shifts:
            shifted = recipe.shifted_task(task, shift)
            points = shifted.n_points if shifted.n_points != task.n_points else None
            if task.name == "relu_network":
                frame = r2_curve(
                    ckpt.model,
                    shifted,
                    recipe.evaluate_prompts // 2,
                    recipe.seed,
                    points,
                    device=device,
                    epochs=recipe.direct_epochs,
                    direct_prompts=recipe.direct_prompts,
                )
                rows += evaluate_rows({"icl_r2": frame}, shifted, shift["label"])
            else:
                frame = error_curve(ckpt.model, shifted, recipe.evaluate_prompts, recipe.seed, points, device=device)
                rows += evaluate_rows({"icl_error": frame}, shifted, shift["label"])
    rows += layer_rows(built.tables, recipe.analyses, task)
    if "spectral" in recipe.analyses and "spectral_summary" not in built.tables:
        raise ConfigError(
            "study analysis 'spectral' reads the layers' induced weights: set \"similarity.simw\" = true "
            'and leave "spectral.enabled" on in the study\'s [set]'
        )
    rows += stage_rows(recipe.analyses, built, ckpt, path)
    if "evidence" in recipe.analyses:
        rows += evidence_rows(built, report, ckpt)
    if "probes" in recipe.analyses:
        rows += probe_rows(built.tables["probes"])
    if "spd_ilw" in recipe.analyses:
        rows += spd_ilw_rows(ckpt.model, task, recipe, device)
    frame = pd.DataFrame(rows)
    frame.insert(0, "model", str(path))
    return frame[COLUMNS]


def model_fields(path: Path, curriculum_stage: bool = False) -> dict[str, Any]:
    """A model's config fields as study columns (n_layer, n_embd, noise_std, train_step, ...)."""

    ckpt = load_study_model(path, curriculum_stage)
    m, t = ckpt.config.model, ckpt.config.task
    step = ckpt.meta.get("train_step") if isinstance(ckpt.meta, dict) else None
    return {
        "family": m.family,
        "n_layer": m.n_layer,
        "n_embd": m.n_embd,
        "n_head": m.n_head,
        "attn_activation": m.attn_activation if family_class(m.family).attention_activation else None,
        "n_dims": t.n_dims,
        "n_points": t.n_points,
        "task": t.name,
        "noise_std": t.noise_std,
        "relu_depth": t.relu_depth if t.name == "relu_network" else None,
        "train_step": step,
        "train_seed": getattr(getattr(ckpt.config, "train", None), "seed", None),
        "format": ckpt.format,
    }
