"""Running a study: per-model work through an executor, results kept per model as they finish.

Executors are existing engines, not a scheduler of ours: `local` is a
`concurrent.futures.ProcessPoolExecutor` (spawned workers, `--jobs N`), `slurm` is submitit's
`AutoExecutor` (Slurm when `sbatch` exists; its `local` or `debug` cluster otherwise, which is
how CI runs the same code path). Each finished model's rows go to `models/<name>/rows.csv`
(atomically, with the key of the recipe and weights that made them), so an interrupted study
recomputes only the models it had not finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.config import from_dict, merge
from ..core.errors import ConfigError, ProbeError, RenamedSetting
from ..core.omp import usable_cpus
from ..core.progress import tqdm
from ..core.registry import unknown_name_message
from ..core.settings import query_count
from ..core.validate import check_device, check_memory, positive_int
from ..io.checkpoint import atomic_write
from ..io.outputs import safe_name
from ..reporting.build import check_report_size
from ..reporting.cache import code_digest
from ..reporting.recipe import adapt_recipe
from .analyses import analyse_model, load_study_model, model_fields, report_stages_of
from .present import read_table
from .recipe import CHECKPOINT_ANALYSES, StudyRecipe, resolve_models, varying_axis

log = logging.getLogger(__name__)
EXECUTORS = ("local", "slurm")
SLURM_CLUSTERS = ("auto", "local", "debug")


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def model_key(path: Path, recipe: StudyRecipe) -> str:
    """What a model's rows depend on: the recipe, the checkpoint (its fingerprint) and the code."""

    digest = hashlib.sha256(json.dumps(recipe.to_dict(), sort_keys=True, default=str).encode())
    digest.update(load_study_model(path, recipe.curriculum_stage).fingerprint.encode())
    digest.update(code_digest().encode())
    return digest.hexdigest()[:16]


def study_from_checkpoints(
    paths: list[str], report: str = "quick", overrides: list[dict[str, Any]] | None = None
) -> StudyRecipe:
    """A study of the named checkpoints (`icl-probe study CK1 CK2 ... --recipe quick`): the
    CHECKPOINT_ANALYSES on each, with the report recipe `report`, on the axis the models vary
    along (`varying_axis`); `overrides` (--set) as in a study recipe."""
    from ..core.errors import ProbeError
    from .analyses import model_fields

    fields = []
    for path in paths:
        if not Path(path).is_dir():
            raise ConfigError(
                f"study: {path} is not a checkpoint directory (name a study recipe alone, or run directories)"
            )
        try:
            fields.append(model_fields(Path(path)))
        except ProbeError as err:
            raise ConfigError(f"study model {path}: {err}") from None
    data: dict[str, Any] = {
        "name": "checkpoints",
        "description": "The checkpoints named on the command line: " + ", ".join(Path(p).name for p in paths),
        "checkpoints": list(paths),
        "analyses": list(CHECKPOINT_ANALYSES),
        "x": varying_axis(fields),
        "report": report,
    }
    for override in overrides or []:
        data = merge(data, override)
    return from_dict(StudyRecipe, data)


def check_models(models: list[Path], x: str = "", curriculum_stage: bool = False) -> dict[str, dict[str, Any]]:
    """Load every model's config before any heavy work; the models must share one task family, and
    its dimension too unless the dimension is what the study varies (`x = "n_dims"`, or snapshots
    each at its own `curriculum_stage`: every analysis runs on each model's own task, and the
    study's tables are per model)."""
    fields = {}
    for path in models:
        try:
            fields[_relative(path)] = model_fields(path, curriculum_stage)
        except ProbeError as err:
            raise ConfigError(f"study model {path}: {err}") from None
    per_model_dims = x == "n_dims" or curriculum_stage
    kinds = {(f["task"], 0 if per_model_dims else f["n_dims"]) for f in fields.values()}
    if len(kinds) > 1:
        raise ConfigError(
            "study models have different tasks: "
            + ", ".join(f"{m} ({f['task']}, d={f['n_dims']})" for m, f in fields.items())
            + '; a study compares one task (models of several d only with x = "n_dims")'
        )
    return fields


def check_study_size(recipe: StudyRecipe, models: list[Path]) -> None:
    """Refuse, before any model runs, a study whose sizes would not fit in memory: each model's
    report stages (as a report would check them) and its spd_ilw arrays (prompts x prefixes x
    queries predictions of the model and of every compared learner's grid)."""
    report = recipe.report_recipe()
    report.prompts.curve = recipe.evaluate_prompts
    for path in models:
        ckpt = load_study_model(path, recipe.curriculum_stage)
        for shift in recipe.shifts:  # values a model's task cannot take (e.g. a negative noise)
            recipe.shifted_task(ckpt.config.task, shift)
        try:
            check_report_size(ckpt, adapt_recipe(report, ckpt.config), only=report_stages_of(recipe.analyses))
        except ConfigError as err:  # prompts.curve is the study's evaluate_prompts; the others its `set` keys
            raise ConfigError(str(err).replace("prompts.curve", "evaluate_prompts")) from None
        if "spd_ilw" in recipe.analyses:
            task = ckpt.config.task
            queries = query_count(recipe.queries, task.n_dims)
            grid = sum(math.prod(len(v) if isinstance(v, list) else 1 for v in c.grid.values()) for c in recipe.compare)
            check_memory(
                recipe.prompts * task.n_points * queries * 8 * (4 + 2 * max(grid, 1) + task.n_dims),
                f"study prompts = {recipe.prompts} with {queries} queries on {_relative(path)}",
                "lower prompts or queries in the study recipe (or --set prompts=...)",
            )


def _init_worker() -> None:
    warnings.simplefilter("ignore", RenamedSetting)  # the command has said it once already


@contextmanager
def child_threads(threads: int) -> Iterator[None]:
    """OMP_NUM_THREADS = `threads` for the processes started inside (a spawned worker's torch reads
    it as it loads), this process's environment as it was after. Not torch.set_num_threads in the
    worker: with more than one thread that makes MKL's batched LU of systems from 257 x 257 on
    (the read-outs at Garg et al.'s width 256) wrong or failing in torch 2.13's CPU build
    (probe/core/threads.py)."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before


def _submit_local(
    pending: list[tuple[str, Path, tuple]], jobs: int, on_done: Callable[[str, pd.DataFrame], None]
) -> None:
    if jobs == 1:  # in this process: stages a script registered itself (not by entry point) count
        for name, path, args in pending:
            on_done(name, analyse_model(str(path), *args))
        return
    threads = max(1, usable_cpus() // jobs)
    spawn = get_context("spawn")
    with (
        child_threads(threads),
        ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, initializer=_init_worker) as pool,
    ):
        futures = {pool.submit(analyse_model, str(path), *args): name for name, path, args in pending}
        for future in as_completed(futures):
            on_done(futures[future], future.result())


def _submit_slurm(
    pending: list[tuple[str, Path, tuple]],
    jobs: int,
    folder: Path,
    cluster: str,
    on_done: Callable[[str, pd.DataFrame], None],
) -> None:
    try:
        import submitit
    except ImportError:
        raise ConfigError("--executor slurm needs submitit: pip install submitit") from None
    executor = submitit.AutoExecutor(folder=str(folder), cluster=None if cluster == "auto" else cluster)
    executor.update_parameters(
        timeout_min=240, cpus_per_task=max(1, usable_cpus() // jobs), slurm_array_parallelism=jobs
    )
    submitted = [(name, executor.submit(analyse_model, str(path), *args)) for name, path, args in pending]
    for name, job in submitted:
        on_done(name, job.result())


def _check_run_options(executor: str, cluster: str, jobs: int, device: str) -> tuple[int, str]:

    if executor not in EXECUTORS:
        raise ConfigError(unknown_name_message("executor", executor, list(EXECUTORS)))
    if cluster not in SLURM_CLUSTERS:
        raise ConfigError(f"--slurm-cluster must be one of {', '.join(SLURM_CLUSTERS)}, got {cluster!r}")
    return positive_int(jobs, "--jobs"), check_device(device)


def _finished(folder: Path, key: str) -> bool:
    """Whether a model's rows were written by a finished run of the same study key (resume)."""
    try:
        return json.loads((folder / "done.json").read_text()).get("key") == key and (folder / "rows.csv").is_file()
    except (OSError, ValueError, AttributeError):
        return False


def run_study(
    recipe: StudyRecipe,
    out: Path,
    *,
    executor: str = "local",
    jobs: int = 1,
    device: str = "cpu",
    cluster: str = "auto",
    progress: bool = True,
    base: Path | None = None,
) -> pd.DataFrame:
    """Run (or resume) the study into `out`; returns the tidy study table."""

    jobs, device = _check_run_options(executor, cluster, jobs, device)
    models = resolve_models(recipe, base)
    fields = check_models(models, recipe.x, recipe.curriculum_stage)
    recipe.report_recipe()  # a bad report recipe or override fails here, before any work
    units = study_units(recipe, models)  # name -> (checkpoint, the recipe it runs with, extra fields)
    names = {name: path for name, (path, _, _) in units.items()}
    folders = {name: out / "models" / safe_name(name) for name in names}
    if len(set(folders.values())) != len(folders):
        raise ConfigError("two study models map to the same output folder; rename one")
    keys = {name: model_key(path, unit) for name, (path, unit, _) in units.items()}
    cache = str(out / ".cache")
    pending = [
        (name, path, (unit.to_dict(), cache, device))
        for name, (path, unit, _) in units.items()
        if not _finished(folders[name], keys[name])
    ]
    log.info("study %s: %d models, %d to run", recipe.name, len(names), len(pending))
    bar = tqdm(total=len(pending), desc="study models", disable=not progress)

    def on_done(name: str, frame: pd.DataFrame) -> None:

        folder = folders[name]
        folder.mkdir(parents=True, exist_ok=True)
        frame = frame.assign(model=name)
        atomic_write(folder / "rows.csv", lambda p: frame.to_csv(p, index=False))
        atomic_write(folder / "done.json", lambda p: p.write_text(json.dumps({"model": name, "key": keys[name]})))
        bar.update(1)

    if pending:
        if executor == "local":
            _submit_local(pending, jobs, on_done)
        else:
            _submit_slurm(pending, jobs, out / "submitit", cluster, on_done)
    bar.close()
    table = pd.concat([read_table(folders[name] / "rows.csv") for name in names], ignore_index=True)
    config = pd.DataFrame(
        [{"model": name, **fields[_relative(path)], **extra} for name, (path, _, extra) in units.items()]
    )
    return table.merge(config, on="model", how="left")


def study_units(recipe: StudyRecipe, models: list[Path]) -> dict[str, tuple[Path, StudyRecipe, dict[str, Any]]]:
    """What the study analyses, by the name its rows carry: each model once, or, with `prompt_seeds`,
    once per seed (named "<model> (prompt seed <s>)", its report prompts and the study's own draws
    from that seed, its `prompt_seed` a column): the same model on independent prompt draws."""
    if not recipe.prompt_seeds:
        return {_relative(p): (p, recipe, {}) for p in models}
    out = {}
    for path in models:
        for seed in recipe.prompt_seeds:
            seeded = dataclasses.replace(recipe, seed=seed, set={**recipe.set, "prompts.seed": seed})
            out[f"{_relative(path)} (prompt seed {seed})"] = (path, seeded, {"prompt_seed": seed})
    return out
