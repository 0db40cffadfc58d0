"""A report's figures drawn beside its stages: each stage's figures go to one worker process as soon
as the stage's tables exist, so matplotlib runs while later stages compute and the report waits
only for what is left after its last stage (`FigurePool.wait`).

The worker is a fresh interpreter (multiprocessing "spawn": no copy of the parent's torch threads):
it loads the toolkit's own stages and the entry-point plugins' (probe/core/stages.py), and draws
with the same style (probe/core/plotting.py), so its PNGs are byte-identical to drawing in the
report's process. A stage it does not know (one a script registered in its own process) is drawn
in the report's process at `wait`. A spawned worker imports the main module again; where that is a
user's script (which may call `probe.report` without an `if __name__ == "__main__"` guard) the
figures are drawn in the report's process as each stage finishes instead (`worker_safe`).

With a stage cache, a stage's figures are kept beside it (<cache>/figures/<key>/): the key is the
toolkit's whole source, the stage, the checkpoint's name and config, the recipe sections the stage
reads (its cache key's, and [[sweeps]], whose titles the figures write) and every table the figures
are given, so a report whose stage and its inputs did not change copies its PNGs instead of drawing
them again (`FigureCache`). A stage's figures read no other part of the recipe."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)


def _start_worker() -> None:
    import warnings

    from ..core.plotting import pyplot
    from ..core.stages import registered

    warnings.simplefilter("ignore")  # the report's process has said what there is to say
    pyplot()
    registered()


def _draw(name: str, tables: dict[str, pd.DataFrame], fig_dir: Path, context: Any) -> dict[str, Path] | None:
    """One stage's figures, in the worker; None where the worker does not know the stage."""
    from ..core.stages import registered

    stage = registered().get(name)
    return None if stage is None else stage.draw(tables, fig_dir, context)


def light_context(ckpt, recipe) -> Any:
    """What a stage's `figures` hook reads of the report's context (.recipe, .ckpt.name,
    .ckpt.config), small enough to send to the worker."""
    return SimpleNamespace(recipe=recipe, ckpt=SimpleNamespace(name=ckpt.name, config=ckpt.config, path=ckpt.path))


def worker_safe() -> bool:
    """Whether a spawned worker can start here: the main module is the icl-probe command, `python -m`
    of a module, or has no file (a notebook, `python -c`, an interactive session)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path is None or getattr(main, "__spec__", None) is not None or Path(path).name == "icl-probe"


class FigureCache:
    """A stage's PNGs kept under `root`, keyed by everything they are drawn from (module docstring)."""

    def __init__(self, root: Path, ckpt, recipe):
        self.root, self.recipe = root, recipe
        self.base = hashlib.sha256(f"{_source_digest()}/{ckpt.name}/{ckpt.config!r}".encode()).hexdigest()

    def key(self, stage, tables: dict[str, pd.DataFrame]) -> str:
        """`stage` (a report Stage: .name, .sections) drawn from `tables`."""
        recipe = self.recipe.digest(*dict.fromkeys((*stage.sections, "sweeps")))
        digest = hashlib.sha256(f"{self.base}/{stage.name}/{recipe}".encode())
        for name in sorted(tables):  # as CSV: a table the stage cache read back keys as the one it wrote
            digest.update(f"{name}\n{tables[name].to_csv(index=False)}".encode())
        return digest.hexdigest()[:24]

    def get(self, key: str, fig_dir: Path) -> dict[str, Path] | None:
        """The kept figures copied into `fig_dir`, name -> PNG; None where none are kept (or a file is missing)."""
        folder = self.root / key
        try:
            names = json.loads((folder / "figures.json").read_text())
            fig_dir.mkdir(parents=True, exist_ok=True)
            out = {}
            for name, relative in names.items():
                out[name] = fig_dir / relative
                out[name].parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / relative, out[name])
            return out
        except (OSError, ValueError):
            return None

    def put(self, key: str, fig_dir: Path, drawn: dict[str, Path]) -> None:
        """Keep `drawn` (PNGs under `fig_dir`), written whole or not at all: in a folder of this
        process's own, renamed into place (another process keeping the same figures first wins). A
        failure to keep them is logged, never raised: the report has its figures either way."""
        folder = self.root / key
        if folder.exists() or not all(path.is_relative_to(fig_dir) for path in drawn.values()):
            return
        partial = self.root / f"{key}.{os.getpid()}.partial"
        try:
            partial.mkdir(parents=True)  # raises where it is already there: nothing not made here is removed
        except OSError as err:
            log.warning("figures of %s not kept in the cache: %s", key, err)
            return
        try:
            names = {}
            for name, path in drawn.items():
                relative = path.relative_to(fig_dir).as_posix()
                (partial / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, partial / relative)
                names[name] = relative
            (partial / "figures.json").write_text(json.dumps(names, indent=2) + "\n")
            partial.rename(folder)
        except OSError as err:
            if not folder.exists():  # (where it does, another process kept the same figures first)
                log.warning("figures of %s not kept in the cache: %s", key, err)
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # the folder this call made (renamed away on success)


def _source_digest() -> str:
    """The toolkit's whole source (figures and their style included)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class FigurePool:
    """Stage figures drawn in one worker process while the report goes on (`submit`), collected by
    `wait`, which also reports how long the report's process was blocked on figures."""

    def __init__(self, fig_dir: Path, ckpt, recipe, here: Any, worker: bool | None = None, cache: Path | None = None):
        self.fig_dir = fig_dir
        self.cache = None if cache is None else FigureCache(cache, ckpt, recipe)
        self.context = light_context(ckpt, recipe)
        self.here = here  # the report's own context, for figures drawn in this process
        worker = worker_safe() if worker is None else worker
        spawn = get_context("spawn")
        self.pool = ProcessPoolExecutor(1, mp_context=spawn, initializer=_start_worker) if worker else None
        # (stage, its tables, its figures or their future, the figure cache's key where one is to be kept)
        self.pending: list[tuple[Any, dict[str, pd.DataFrame], Future | dict[str, Path], str]] = []
        self.blocked = 0.0  # seconds the report's process spent on figures (waiting or drawing)

    def submit(self, stage, tables: dict[str, pd.DataFrame]) -> None:
        """Draw `stage`'s figures from `tables` (the report's tables so far): copied from the figure
        cache where it keeps them, else in the worker, or here and now without one."""
        if not stage.declared.overrides("figures"):
            return
        start = time.perf_counter()
        key = "" if self.cache is None else self.cache.key(stage, tables)
        kept = self.cache.get(key, self.fig_dir) if self.cache is not None else None
        drawn: Future | dict[str, Path]
        if kept is not None:
            drawn, key = kept, ""  # nothing new to keep
        elif self.pool is None:
            drawn = stage.figures(tables, self.fig_dir, self.here)
        else:
            drawn = self.pool.submit(_draw, stage.name, dict(tables), self.fig_dir, self.context)
        self.pending.append((stage, tables, drawn, key))
        self.blocked += time.perf_counter() - start

    def wait(self) -> dict[str, Path]:
        """Every submitted stage's figures, name -> PNG (a stage the worker did not know is drawn
        here); a figure that failed raises here."""
        start = time.perf_counter()
        out: dict[str, Path] = {}
        try:
            for stage, tables, pending, key in self.pending:
                drawn = pending.result() if isinstance(pending, Future) else pending
                drawn = stage.figures(tables, self.fig_dir, self.here) if drawn is None else drawn
                if key and self.cache is not None:
                    self.cache.put(key, self.fig_dir, drawn)
                out.update(drawn)
        finally:
            self.close()
        self.blocked += time.perf_counter() - start
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
