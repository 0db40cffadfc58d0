"""Fill README.md's quoted numbers from the committed reports' summary.json.

A quoted number is written between markers, `<!-- n:REPORT:PATH:FORMAT -->value<!-- /n -->`
(PATH dotted, list indices as numbers; FORMAT a Python format spec, empty for text), so that a
regenerated report updates the README: `python scripts/readme_numbers.py` rewrites the values,
`--check` exits 1 (naming each) where one differs from its file (tests/test_docs.py runs it).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- n:([^:]+):([^:]+):([^ ]*) -->(.*?)<!-- /n -->", re.DOTALL)


def _macros():
    """docs/macros.py: the docs' own reading of a report's numbers, so both quote them alike."""
    spec = importlib.util.spec_from_file_location("docs_macros", REPO / "docs" / "macros.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def value(report: str, path: str, fmt: str) -> str:
    data = _macros().lookup(report, path)
    return format(data, fmt) if fmt and isinstance(data, (int, float)) else str(data)


def render(text: str) -> str:
    return MARKER.sub(lambda m: f"<!-- n:{m[1]}:{m[2]}:{m[3]} -->{value(m[1], m[2], m[3])}<!-- /n -->", text)


def main(argv: list[str]) -> int:
    readme = REPO / "README.md"
    text = readme.read_text()
    fresh = render(text)
    if "--check" in argv:
        stale = [(m[1], m[2], m[4]) for m in MARKER.finditer(text) if value(m[1], m[2], m[3]) != m[4]]
        for report, path, quoted in stale:
            print(f"README.md quotes {quoted!r} for {report} {path}; the report says {value(report, path, '')!r}")
        return 1 if stale else 0
    readme.write_text(fresh)
    print(f"README.md: {len(MARKER.findall(text))} quoted numbers filled from the reports")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
