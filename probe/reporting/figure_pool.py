"""A report's figures drawn beside its stages: each stage's figures go to one worker process as soon
as the stage's tables exist, so matplotlib runs while later stages compute and the report waits
only for what is left after its last stage (`FigurePool.wait`).

The worker is a fresh interpreter (multiprocessing "spawn": no copy of the parent's torch threads):
it loads the toolkit's own stages and the entry-point plugins' (probe/core/stages.py), and draws
with the same style (probe/core/plotting.py), so its PNGs are byte-identical to drawing in the
report's process. A stage it does not know (one a script registered in its own process) is drawn
in the report's process at `wait`. A spawned worker imports the main module again; where that is a
user's script (which may call `probe.report` without an `if __name__ == "__main__"` guard) the
figures are drawn in the report's process as each stage finishes instead (`worker_safe`)."""

from __future__ import annotations

import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd


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


class FigurePool:
    """Stage figures drawn in one worker process while the report goes on (`submit`), collected by
    `wait`, which also reports how long the report's process was blocked on figures."""

    def __init__(self, fig_dir: Path, ckpt, recipe, here: Any, worker: bool | None = None):
        self.fig_dir = fig_dir
        self.context = light_context(ckpt, recipe)
        self.here = here  # the report's own context, for figures drawn in this process
        worker = worker_safe() if worker is None else worker
        spawn = get_context("spawn")
        self.pool = ProcessPoolExecutor(1, mp_context=spawn, initializer=_start_worker) if worker else None
        self.pending: list[tuple[Any, dict[str, pd.DataFrame], Future | dict[str, Path]]] = []
        self.blocked = 0.0  # seconds the report's process spent on figures (waiting or drawing)

    def submit(self, stage, tables: dict[str, pd.DataFrame]) -> None:
        """Draw `stage`'s figures from `tables` (the report's tables so far): in the worker, or here
        and now without one."""
        if not stage.declared.overrides("figures"):
            return
        start = time.perf_counter()
        if self.pool is None:
            drawn: Future | dict[str, Path] = stage.figures(tables, self.fig_dir, self.here)
        else:
            drawn = self.pool.submit(_draw, stage.name, dict(tables), self.fig_dir, self.context)
        self.pending.append((stage, tables, drawn))
        self.blocked += time.perf_counter() - start

    def wait(self) -> dict[str, Path]:
        """Every submitted stage's figures, name -> PNG (a stage the worker did not know is drawn
        here); a figure that failed raises here."""
        start = time.perf_counter()
        out: dict[str, Path] = {}
        try:
            for stage, tables, pending in self.pending:
                drawn = pending.result() if isinstance(pending, Future) else pending
                out.update(stage.figures(tables, self.fig_dir, self.here) if drawn is None else drawn)
        finally:
            self.close()
        self.blocked += time.perf_counter() - start
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
