"""The main jobs from one import: `probe.report`, `probe.analyse`, `probe.activations`,
`probe.probe_data` and `probe.run_study`, with the command line's defaults (a recipe: quick unless
named) and the command line's checks. The CLI's `report` calls `report` below.

    import probe
    result = probe.report(recipe="smoke", out="runs/smoke")       # a report, as `icl-probe report`
    result.summary["table1"], result.tables["best_match"], result.figures["heatmap_newton"]
    layers = probe.analyse(recipe="quick", prompts={"test": 128})  # the report's layers stage
    acts = probe.activations(ckpt, xs, ys)                          # a Capture
    H, Y = probe.probe_data(acts, xs, ys, layer=3, t=8, target="w_ols")

Recipe overrides are keyword arguments, one mapping per recipe section (`prompts={"test": 128}`),
the same values `--set prompts.test=128` gives.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .core.errors import ConfigError


@dataclass
class ReportResult:
    """A written report: its directory, summary.json as a dict (the fields of
    probe/reporting/schema.py's Summary; see the README's "summary.json"), every table of data/ as a
    DataFrame (name -> frame, the CSV files' columns) and every figure's PNG path (name -> path)."""

    path: Path
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)

    @property
    def evidence(self) -> pd.DataFrame:
        """The evidence table (probe/reporting/evidence.py): one row per (question, instrument) and
        each question's consolidated answer; empty where the report has none."""
        return self.tables.get("evidence", pd.DataFrame())

    @property
    def spectral(self) -> pd.DataFrame:
        """Each layer's spectral verdict and local exponent p with its 90% interval, in the bin
        variable of its best family (summary.json's `spectral`); empty where it was not measured."""
        block = self.summary.get("spectral") or {}
        columns = ("layer", "verdict", "p", "p_low", "p_high", "variable")
        if not all(isinstance(block.get(c), list) for c in columns):
            return pd.DataFrame(columns=list(columns))
        return pd.DataFrame({c: block[c] for c in columns})

    @classmethod
    def read(cls, path: Path) -> ReportResult:
        path = Path(path)
        read = lambda p: pd.read_csv(p) if p.read_text().strip() else pd.DataFrame()  # empty: a stage found nothing
        tables = {p.stem: read(p) for p in sorted((path / "data").glob("*.csv"))}
        figures = {p.stem: p for p in sorted((path / "figures").glob("*.png"))}
        return cls(path, json.loads((path / "summary.json").read_text()), tables, figures)


def _overrides(sections: dict[str, Any]) -> list[dict[str, Any]]:
    """Keyword sections ({"prompts": {"test": 128}}) as recipe overrides."""
    out = []
    for section, values in sections.items():
        if not isinstance(values, dict):
            raise ConfigError(
                f"recipe override {section}={values!r}: give a mapping of that section's keys, "
                f"e.g. {section}={{'key': value}}"
            )
        out.append({section: values})
    return out


def _checkpoint(checkpoint):
    """A LoadedCheckpoint from a path, a LoadedCheckpoint, or None (the shipped default)."""
    from .core.resources import default_checkpoint
    from .io.checkpoint import LoadedCheckpoint
    from .io.formats import load_checkpoint

    if isinstance(checkpoint, LoadedCheckpoint):
        return checkpoint
    if checkpoint is None:
        return load_checkpoint(default_checkpoint())
    if isinstance(checkpoint, (str, Path)):
        return load_checkpoint(checkpoint)
    raise ConfigError(
        f"checkpoint must be a path or a LoadedCheckpoint (probe.load_checkpoint), got a {type(checkpoint).__name__}; "
        "for a model object use probe.analyse(model=..., task=...)"
    )


def recipe(name: str = "quick", **sections: Any):
    """A report recipe (analyses/<name>.toml or a path) with keyword sections overriding it: its
    sections are the settings objects the CLI runs (`probe.recipe("quick").probes` is the quick
    report's ProbeSettings, `.interventions` its InterventionSettings, `.prompts`, ...), so the
    Python API can be given exactly the command line's settings. The settings classes' own
    defaults are the quick recipe's values (tested), so `ProbeSettings()` is the quick report's too."""
    from .reporting.recipe import resolve_recipe

    return resolve_recipe(name, _overrides(sections))


def report(
    checkpoint=None,
    recipe: str = "quick",
    out: str | Path | None = None,
    *,
    compare=None,
    device: str = "cpu",
    cache_dir: str | Path | None = None,
    max_memory: str | None = None,
    force: bool = False,
    progress: bool = False,
    **sections: Any,
) -> ReportResult:
    """Build a report, as `icl-probe report` does (the same function, so the same checks and
    numbers): `checkpoint` a path or LoadedCheckpoint (default: the shipped default), `recipe` a
    name in analyses/ or a .toml path, `out` the report directory (default: a new temporary
    directory), `compare` a second checkpoint, `cache_dir` a stage cache (default: none, every
    stage computed), `max_memory` e.g. "2G"; keyword sections override the recipe. Returns the
    written report."""
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="icl-probe-report-")) / "report"
    path = run_report(
        checkpoint, recipe, _overrides(sections), out, compare=compare, device=device, cache_dir=cache_dir,
        max_memory=max_memory, force=force, progress=progress,
    )  # fmt: skip
    return ReportResult.read(path)


def run_report(
    checkpoint,
    recipe: str,
    overrides: list[dict[str, Any]],
    out: str | Path,
    *,
    compare=None,
    device: str = "cpu",
    cache_dir: str | Path | None = None,
    max_memory: str | None = None,
    force: bool = False,
    progress: bool = False,
) -> Path:
    """`report` with the overrides as recipe mappings (the CLI's parsed --set values); everything
    cheap (recipe, device, memory budget, --out) is checked before a checkpoint is loaded."""
    from .core.memory import MemoryBudget
    from .core.validate import check_device, parse_bytes
    from .io.checkpoint import LoadedCheckpoint
    from .io.outputs import OutputTarget
    from .reporting.build import build_report
    from .reporting.recipe import resolve_recipe

    parsed = resolve_recipe(recipe, overrides)
    device = check_device(device)
    memory = MemoryBudget(parse_bytes(max_memory) if max_memory else None)
    inputs = tuple(c.path if isinstance(c, LoadedCheckpoint) else c for c in (checkpoint, compare) if c is not None)
    target = OutputTarget(Path(out), "report", force=force, inputs=tuple(Path(p) for p in inputs))
    ckpt = _checkpoint(checkpoint)
    other = _checkpoint(compare) if compare is not None else None
    cache = Path(cache_dir) if cache_dir is not None else None
    build_report(ckpt, parsed, target, device=device, compare=other, cache_dir=cache, progress=progress, memory=memory)
    return target.path


def analyse(
    checkpoint=None,
    recipe: str = "quick",
    *,
    model=None,
    task=None,
    device: str = "cpu",
    progress: bool = False,
    cache_dir: str | Path | None = None,
    **sections: Any,
):
    """The report's layers stage (read-outs, SimE / SimW heatmaps, best matches, trends, Table 1
    and its verdicts, nulls, span test) as a LayerAnalysis, with the recipe's [prompts],
    [readout], [similarity] and sweeps (keyword sections override them). For a model object that
    is not a checkpoint pass `model` and its `task` (a TaskConfig). With `cache_dir`, a repeated
    call on the same checkpoint with the same settings is read from there (the report's stage cache,
    probe/reporting/api_cache.py), not recomputed."""
    from .analysis.pipeline import analyse_layers

    model, task, settings, fingerprint = _layer_job(
        "analyse", checkpoint, recipe, model, task, device, sections, cache_dir
    )
    compute = lambda: analyse_layers(model, task, settings, progress=progress)
    if cache_dir is None:
        return compute()
    from .reporting.api_cache import cached_layers

    return cached_layers(Path(cache_dir), fingerprint, settings, model, compute)


@dataclass
class SpectralResult:
    """`probe.spectral`'s answer, one row per layer first (layer 0: the embedding output).

    layers: layer, verdict, best_class, p, p_low, p_high (the local exponent in the best family's own
        bin variable, `variable`), best_family, best_k, non_filter.
    by_variable: one row per (layer, bin variable): the exponent, the bins used, the best and
        runner-up families and their paired difference (the columns of SpectralAnalysis.layers).
    curves, fits, references, counts: as in SpectralAnalysis (probe/analysis/spectral.py);
    analysis: that SpectralAnalysis itself (its frames name the layer `predictor`)."""

    layers: pd.DataFrame
    by_variable: pd.DataFrame
    curves: pd.DataFrame
    fits: pd.DataFrame
    references: pd.DataFrame
    counts: dict[str, int]
    analysis: Any

    @classmethod
    def of(cls, analysis) -> SpectralResult:
        def named(frame: pd.DataFrame) -> pd.DataFrame:
            out = frame.rename(columns={"predictor": "layer"})
            return out.assign(layer=out["layer"].astype(int))

        return cls(
            named(analysis.summary),
            named(analysis.layers),
            analysis.curves,
            analysis.fits,
            analysis.references,
            analysis.counts,
            analysis,
        )


def spectral(
    checkpoint=None,
    recipe: str = "quick",
    *,
    model=None,
    task=None,
    device: str = "cpu",
    progress: bool = False,
    cache_dir: str | Path | None = None,
    **sections: Any,
):
    """The spectral instrument alone (probe/analysis/spectral.py) as a SpectralResult: each layer's
    filter class and local exponent (`.layers`, one row per layer), per bin variable
    (`.by_variable`), and its response to each eigen-direction of its prompt's S (`.curves`), on
    the induced weights the layers stage makes with the recipe's [prompts], [readout],
    [similarity] and [spectral] (keyword sections override them: `spectral={"bins": 16}`). With
    `cache_dir`, a repeated call with the same checkpoint and settings is read from there."""
    from .analysis.pipeline import analyse_spectrum

    model, task, settings, fingerprint = _layer_job(
        "spectral", checkpoint, recipe, model, task, device, sections, cache_dir
    )
    compute = lambda: analyse_spectrum(model, task, settings, progress=progress)
    if cache_dir is None:
        return SpectralResult.of(compute())
    from .reporting.api_cache import cached_spectrum

    return SpectralResult.of(cached_spectrum(Path(cache_dir), fingerprint, settings, compute))


def _layer_job(job: str, checkpoint, recipe: str, model, task, device: str, sections: dict[str, Any], cache_dir=None):
    """(model, task, LayerSettings, the checkpoint's fingerprint) of a layers-stage job: a checkpoint
    (the recipe adapted to it) or a model object with its task, never both; a cache needs a
    checkpoint (what identifies a model object's weights is not known)."""
    from .analysis.pipeline import LayerSettings
    from .core.validate import check_device
    from .reporting.recipe import adapt_recipe, resolve_recipe

    parsed = resolve_recipe(recipe, _overrides(sections))
    device = check_device(device)
    fingerprint = ""
    if model is None:
        ckpt = _checkpoint(checkpoint)
        model, task, parsed = ckpt.model, ckpt.config.task, adapt_recipe(parsed, ckpt.config)
        fingerprint = ckpt.fingerprint
    elif cache_dir is not None:
        raise ConfigError(
            f"probe.{job}: cache_dir needs a checkpoint (a path or a LoadedCheckpoint), not a model object"
        )
    elif checkpoint is not None:
        raise ConfigError("give a checkpoint or a model (with its task), not both")
    elif task is None:
        raise ConfigError(f"a model object needs its task: probe.{job}(model=m, task=TaskConfig(n_dims=..., ...))")
    return model, task, LayerSettings.from_recipe(parsed, device), fingerprint


def prompts(checkpoint=None, n: int = 64, seed: int = 0, *, task=None):
    """(xs (n, n_points, d), ys (n, n_points)): prompts of a checkpoint's task (or of `task`, a
    TaskConfig), drawn from the evaluation stream of `seed` (probe/core/seeds.py), as `icl-probe evaluate`
    draws them."""
    from .analysis.evaluate import eval_prompts
    from .core.validate import positive_int

    if task is None:
        task = _checkpoint(checkpoint).config.task
    drawn = eval_prompts(task, positive_int(n, "prompts"), seed)
    return drawn.xs, drawn.ys


def run_learner(name: str, xs, ys, queries=None, **grid):
    """A reference learner over its grid on prompts (probe/learners: `run_learner`): a
    LearnerResult with preds (K, B, n) and, for linear learners, weights (K, B, n, d)."""
    from .learners import run_learner as run

    return run(name, xs, ys, queries, **grid)


def activations(model, xs, ys, hooks=("resid",), positions="all", device: str = "cpu", **options):
    """Capture a model's activations on prompts (probe/capture/activations.py `capture`): `model` a
    model, a LoadedCheckpoint or a path; returns a Capture (`pred` (B, n), `acts[name]`, e.g.
    `acts["resid"]` (L+1, B, 2n, D), numpy arrays)."""
    from .capture import capture
    from .io.checkpoint import LoadedCheckpoint

    if isinstance(model, (str, Path, LoadedCheckpoint)):
        model = _checkpoint(model).model
    return capture(model, xs, ys, hooks=list(hooks), positions=positions, device=device, **options)


def probe_data(acts, xs, ys, layer: int, t: int, target: str) -> tuple[np.ndarray, np.ndarray]:
    """(H, Y) for AttentionPoolProbe: H the residual stream at boundary `layer` over the first 2t
    tokens (x_1, y_1, ..., x_t, y_t), (N, 2t, D); Y the target after those t examples, (N, d):
    "xty" (X_t^T y_t) or "w_ols" (the least-squares weights), float64."""
    from .analysis.probes import probe_targets
    from .capture import RESID
    from .core.validate import as_prompt_tensors

    xs, ys, _ = as_prompt_tensors(xs, ys, what="probe_data")
    resid = acts.acts.get(RESID) if hasattr(acts, "acts") else None
    if resid is None:
        raise ConfigError("probe_data needs a capture with the residual stream (hooks including 'resid')")
    if acts.positions is not None:
        raise ConfigError("probe_data needs every token position captured (positions=None)")
    n = xs.shape[1]
    if not 0 <= layer < resid.shape[0]:
        raise ConfigError(f"layer must lie in 0..{resid.shape[0] - 1} (boundaries), got {layer}")
    if not 1 <= t < n:
        raise ConfigError(f"t (examples seen before a query) must lie in 1..{n - 1}, got {t}")
    if resid.shape[1] != xs.shape[0]:
        raise ConfigError(f"the capture holds {resid.shape[1]} prompts but xs has {xs.shape[0]}")
    targets = probe_targets(xs, ys, target)  # (N, n, d): index t holds the target after t examples
    return np.asarray(resid[layer][:, : 2 * t], dtype=np.float64), targets[:, t].numpy()


def run_study(recipe: str, out: str | Path, *, jobs: int = 1, device: str = "cpu", progress: bool = False, **values):
    """Run (or resume) a study recipe (analyses/<name>.toml or a path) into `out`, as `icl-probe
    study` does (the same function); keyword values override the study recipe's top-level values.
    Returns the tidy table (one row per model x analysis x metric)."""
    return run_study_command(recipe, [values] if values else [], out, jobs=jobs, device=device, progress=progress)


def run_study_command(
    recipe: str,
    overrides: list[dict[str, Any]],
    out: str | Path,
    *,
    executor: str = "local",
    jobs: int = 1,
    device: str = "cpu",
    cluster: str = "auto",
    force: bool = False,
    progress: bool = False,
    checkpoints: list[str] | None = None,
) -> pd.DataFrame:
    """`run_study` with the overrides as mappings; every model, shift and size is checked before any
    output (probe/study/run.py), then the study runs, and study.csv, figures, summary.json and
    index.html are written. With `checkpoints`, the study is of those (probe/study/run.py
    `study_from_checkpoints`) and `recipe` is the report recipe their analyses use."""
    import time

    from .core.validate import check_device
    from .io.checkpoint import atomic_write
    from .io.outputs import OutputTarget, mark_run_directory
    from .study.present import write_presentation
    from .study.recipe import resolve_models, resolve_study
    from .study.run import check_models, check_study_size, run_study, study_from_checkpoints

    if checkpoints:
        parsed = study_from_checkpoints(checkpoints, recipe, overrides)
    else:
        parsed = resolve_study(recipe, overrides)
    device = check_device(device)
    models = resolve_models(parsed)  # every checkpoint is an input the output may not hold or replace
    target = OutputTarget(Path(out), "study", force=force, inputs=tuple(models))
    check_models(models, parsed.x, parsed.curriculum_stage)
    check_study_size(parsed, models)
    parsed.report_recipe()
    path = target.path
    mark_run_directory(path, "study")
    start = time.perf_counter()
    table = run_study(parsed, path, executor=executor, jobs=jobs, device=device, cluster=cluster, progress=progress)
    atomic_write(path / "study.csv", lambda p: table.to_csv(p, index=False))
    write_presentation(table, parsed, path, {"total": round(time.perf_counter() - start, 1)})
    mark_run_directory(path, "study")
    return table
