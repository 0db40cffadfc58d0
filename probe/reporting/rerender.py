"""Re-render a report from the files beside it: figures and index.html drawn again from
summary.json, recipe.json and data/ (with the checkpoint, for the model card), no analysis
re-run. For a change of presentation only: the numbers are the report's own, and the page's footer
names the commit that re-rendered it beside the one that computed them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from ..core.errors import ConfigError
from ..core.provenance import git_commit
from ..io.formats import load_checkpoint
from ..io.outputs import MARKER, written_by
from .build import Built, make_figures
from .html import render_html
from .recipe import recipe_from_dict
from .schema import Summary

NOT_TABLES = {"evidence"}  # written from summary.json's evidence, not a stage's table


def _checkpoint(entry: dict, given: Path | None, what: str):
    path = given if given is not None else Path(entry["path"])
    if not path.exists():
        raise ConfigError(
            f"re-render: the {what} checkpoint {path} (recorded in summary.json) is not there; run from the "
            "directory the report was made in, or pass the checkpoint"
        )
    ckpt = load_checkpoint(path)
    if ckpt.sha256 != entry["sha256"]:
        raise ConfigError(
            f"re-render: {path} is not the {what} checkpoint this report was made from (sha256 "
            f"{ckpt.sha256[:12]}..., the report's {entry['sha256'][:12]}...); regenerate the report instead"
        )
    return ckpt


def _read_table(path: Path) -> pd.DataFrame:
    """A table as the build wrote it; an empty one (no columns: a stage that found nothing) stays empty."""
    return pd.read_csv(path) if path.read_text().strip() else pd.DataFrame()


def rerender_report(folder: str | Path, checkpoint: str | Path | None = None) -> Path:
    """Draw `folder`'s figures and write its index.html again from its own files; returns index.html."""
    folder = Path(folder)
    if not (folder / "summary.json").is_file() or not (folder / "data").is_dir():
        raise ConfigError(f"re-render: {folder} is not a report folder (no summary.json and data/)")
    if written_by(folder) != "report":  # its figures/ is replaced: only a folder `icl-probe report` wrote
        raise ConfigError(
            f"re-render: {folder} was not written by `icl-probe report` (its {MARKER} does not say so); "
            "re-render replaces figures/, so it only takes a report folder icl-probe wrote"
        )
    summary = Summary.from_json(json.loads((folder / "summary.json").read_text()))
    recipe = recipe_from_dict(json.loads((folder / "recipe.json").read_text()))
    raw = json.loads((folder / "summary.json").read_text())
    ckpt = _checkpoint(raw["checkpoint"], Path(checkpoint) if checkpoint else None, "report's")
    compare = _checkpoint(raw["compare"]["checkpoint"], None, "compared") if raw.get("compare") else None
    built = Built(
        tables={p.stem: _read_table(p) for p in sorted((folder / "data").glob("*.csv")) if p.stem not in NOT_TABLES},
        data={p.stem: json.loads(p.read_text()) for p in sorted((folder / "data").glob("*.json"))},
        timings=dict(summary.timings),
    )
    staged = folder / "figures.rerender"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        drawn = make_figures(built, ckpt, recipe, staged, compare)
        figs = {name: folder / "figures" / path.name for name, path in drawn.items()}  # where they will lie
        page = render_html(built, summary, figs, ckpt, recipe, compare, rendered=git_commit())
        (folder / "index.html.tmp").write_text(page)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        (folder / "index.html.tmp").unlink(missing_ok=True)
        raise
    shutil.rmtree(folder / "figures", ignore_errors=True)
    staged.rename(folder / "figures")
    (folder / "index.html.tmp").replace(folder / "index.html")
    return folder / "index.html"
