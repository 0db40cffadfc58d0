"""What produced an output: package versions, git commit, time."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

VERSION = "0.1.0"  # the package version (probe.__version__)

PACKAGES = ("icl-probe", "torch", "transformer-lens", "transformers", "numpy", "scikit-learn", "pandas")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# the committed evaluations beside the checkpoints (scripts/regenerate_reports.sh rewrites them)
# the checkpoints' committed evaluations that scripts/regenerate_reports.sh rewrites: eval/, eval-shift-*/,
# eval-mixture-*/, eval-param-mean-*/, eval-points-*/
EXAMPLES = (":(top,exclude,glob)checkpoints/**/eval/**", ":(top,exclude,glob)checkpoints/**/eval-*/**")


def git_commit(cwd: Path | None = None) -> str:
    """HEAD of the repository holding this package (suffix '-dirty' if it has changes outside reports/
    and the checkpoints' committed evaluations, which regenerating the committed examples changes),
    or 'unknown'."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)reports",
                *EXAMPLES,
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def stamp() -> dict[str, Any]:
    return {
        "versions": versions(),
        "git_commit": git_commit(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def display_path(path) -> str:
    """A checkpoint path for summary.json: relative to the working directory when under it, else
    the directory's name; never an absolute machine path."""

    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name
