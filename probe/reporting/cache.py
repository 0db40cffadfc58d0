"""On-disk cache of report stages: tables (CSV), JSON and arrays (.npy, a stage's numpy data such as
the layers' induced weights), keyed by checkpoint hash and recipe.

A stage's key covers everything its numbers depend on (the checkpoint's fingerprint: weights,
resolved config and every config or weight file; the recipe sections it reads; the code of every
module that computes numbers, report stages included), so a re-run that changes only plotting or
wording reuses it, and changed analysis code never reads stale results. Every file of an entry,
and its JSON data, is checksummed. Reports keep the cache in one per-user place
(`probe.core.resources.cache_dir()`, or `--cache-dir`), never beside a user's files; a study keeps it
inside its own output directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.provenance import VERSION as __version__
from ..io.outputs import replace_dir, staging_dir

log = logging.getLogger(__name__)


PACKAGE = Path(__file__).resolve().parents[1]
# code that only presents results (figures, wording, the command line) does not invalidate stages
PRESENTATION = (
    "cli/",
    "reporting/figures.py",
    "interventions/figures.py",
    "reporting/html.py",
    "reporting/findings.py",
    "reporting/answer.py",
    "reporting/page.py",
    "reporting/rerender.py",
)


def code_digest() -> str:
    """Hash of the toolkit's source that computes numbers (all of probe/ but PRESENTATION)."""

    digest = hashlib.sha256(__version__.encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(PRESENTATION):
            digest.update(relative.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


class StageCache:
    def __init__(self, root: Path | None):
        self.root = root
        self.code = code_digest()

    def _dir(self, key: str) -> Path | None:
        return None if self.root is None else self.root / f"{key}-{self.code}"

    def holds(self, key: str) -> bool:
        """Whether an entry for `key` was written (`get_or_run` still checks it before use)."""
        folder = self._dir(key)
        return folder is not None and (folder / "done.json").exists()

    def get_or_run(
        self, key: str, run: Callable[[], tuple[dict[str, pd.DataFrame], dict[str, Any]]]
    ) -> tuple[dict[str, pd.DataFrame], dict[str, Any], bool]:
        """Returns (tables, data, hit). `run` returns tables and JSON-serialisable data.

        An entry is used only if every file matches the sha256 recorded in its done.json; a
        missing, truncated or edited entry is recomputed (with a warning), never published.
        """
        folder = self._dir(key)
        if folder is not None and folder.exists():
            cached = self._read(folder)
            if cached is not None:
                log.info("stage %s: cached", key)
                return cached[0], cached[1], True
            log.warning("cache entry %s is incomplete or was modified; recomputing it", folder)
        tables, data = run()
        if folder is not None:
            self._write(folder, tables, data)
        return tables, data, False

    @staticmethod
    def _read(folder: Path) -> tuple[dict[str, pd.DataFrame], dict[str, Any]] | None:
        try:
            meta = json.loads((folder / "done.json").read_text())
            sums = meta["sha256"]
            for name, expected in sums.items():
                if _sha256(folder / name) != expected:
                    return None
            tables = {name: pd.read_csv(folder / f"{name}.csv") for name in meta["tables"]}
            arrays = meta.get("arrays", [])
            if {f"{name}.csv" for name in meta["tables"]} - set(sums) or {f"{name}.npy" for name in arrays} - set(sums):
                return None
            if meta["data_sha256"] != _data_sha256(meta["data"]):
                return None
            return tables, {**meta["data"], **{n: np.load(folder / f"{n}.npy", allow_pickle=False) for n in arrays}}
        except (OSError, ValueError, KeyError, TypeError, pd.errors.ParserError, pd.errors.EmptyDataError):
            return None

    def _write(self, folder: Path, tables: dict[str, pd.DataFrame], data: dict[str, Any]) -> None:

        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = staging_dir(folder.parent, folder.name)  # private name: concurrent runs never share it
        except OSError as err:
            log.warning("could not write cache entry %s: %s", folder, err)
            return
        try:
            for name, frame in tables.items():
                frame.to_csv(tmp / f"{name}.csv", index=False)
            arrays = {name: value for name, value in data.items() if isinstance(value, np.ndarray)}
            for name, value in arrays.items():
                np.save(tmp / f"{name}.npy", value, allow_pickle=False)
            sums = {f"{name}.csv": _sha256(tmp / f"{name}.csv") for name in tables}
            sums.update({f"{name}.npy": _sha256(tmp / f"{name}.npy") for name in arrays})
            rest = {name: value for name, value in data.items() if name not in arrays}
            data = json.loads(json.dumps(rest, default=_jsonable))  # as it will be read back
            entry = {
                "tables": list(tables),
                "arrays": list(arrays),
                "data": data,
                "data_sha256": _data_sha256(data),
                "sha256": sums,
            }
            (tmp / "done.json").write_text(json.dumps(entry))
            replace_dir(tmp, folder)
        except OSError as err:  # a cache that cannot be written costs time, never the report
            log.warning("could not write cache entry %s: %s", folder, err)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data_sha256(data: Any) -> str:

    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
