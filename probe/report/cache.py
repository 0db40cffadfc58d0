"""On-disk cache of report stages: tables (CSV) and JSON, keyed by checkpoint hash and recipe.

A stage's key covers everything its numbers depend on (checkpoint sha256, the recipe sections
it reads, and the toolkit's analysis code), so a re-run that changes only plotting or wording
reuses it, and changed analysis code never reads stale results.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .. import __version__

log = logging.getLogger(__name__)


PACKAGE = Path(__file__).resolve().parents[1]
NOT_NUMERIC = ("report", "cli")  # code that only presents results does not invalidate stages


def code_digest() -> str:
    """Hash of the toolkit's source that computes numbers (everything but report/ and cli/)."""
    import hashlib

    digest = hashlib.sha256(__version__.encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] not in NOT_NUMERIC:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


class StageCache:
    def __init__(self, root: Path | None):
        self.root = root
        self.code = code_digest()

    def _dir(self, key: str) -> Path | None:
        return None if self.root is None else self.root / f"{key}-{self.code}"

    def get_or_run(self, key: str, run: Callable[[], tuple[dict[str, pd.DataFrame], dict[str, Any]]]
                   ) -> tuple[dict[str, pd.DataFrame], dict[str, Any], bool]:
        """Returns (tables, data, hit). `run` returns tables and JSON-serialisable data."""
        folder = self._dir(key)
        if folder is not None and (folder / "done.json").exists():
            meta = json.loads((folder / "done.json").read_text())
            tables = {name: pd.read_csv(folder / f"{name}.csv") for name in meta["tables"]}
            log.info("stage %s: cached", key)
            return tables, meta["data"], True
        tables, data = run()
        if folder is not None:
            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name, frame in tables.items():
                frame.to_csv(tmp / f"{name}.csv", index=False)
            (tmp / "done.json").write_text(json.dumps({"tables": list(tables), "data": data}, default=_jsonable))
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        return tables, data, False


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
