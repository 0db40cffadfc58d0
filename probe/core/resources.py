"""Where the shipped recipes and the default checkpoint live.

In a source checkout they are the repository's `analyses/` and `checkpoints/gpt2-default/`
(the files a user edits). An installed wheel carries copies in `probe/_shipped/` (written by
setup.py's build step), so `icl-probe report` works after `pip install .` from any directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # probe/
SOURCE_ROOT = PACKAGE.parent
SHIPPED = PACKAGE / "_shipped"


def in_source_checkout() -> bool:
    return (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / "analyses").is_dir()


def shipped(relative: str) -> Path:
    """The repository's copy in a source checkout, else the wheel's."""
    return (SOURCE_ROOT if in_source_checkout() else SHIPPED) / relative


def cache_dir() -> Path:
    """The per-user stage cache of reports: $ICL_PROBE_CACHE, else $XDG_CACHE_HOME/icl-probe,
    else ~/.cache/icl-probe."""

    if os.environ.get("ICL_PROBE_CACHE"):
        return Path(os.environ["ICL_PROBE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icl-probe"


RECIPE_DIR = shipped("analyses")
TRAINING_RECIPE_DIR = shipped("recipes")
DEFAULT_CHECKPOINT = shipped("checkpoints/gpt2-default")


def default_checkpoint() -> Path:
    """The shipped default checkpoint (what `icl-probe report` uses without a checkpoint): the
    repository's in a checkout, the wheel's copy otherwise."""
    return DEFAULT_CHECKPOINT


def training_recipe(name_or_path: str) -> Path:
    """A training recipe: a path that exists, else a shipped one by name ("tiny") or by the
    path the README and --help use ("recipes/tiny.toml"), so both work from an installed wheel."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped_copy = TRAINING_RECIPE_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    return shipped_copy if shipped_copy.is_file() else path
