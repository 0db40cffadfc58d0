"""Compare the committed reports' summary.json numbers between a git revision and the working tree.

    python scripts/compare_reports.py [REV]        (default REV: HEAD)

For every reports/*/summary.json, each number that differs by more than 1e-6 (relative, at least
absolute), each string that differs and each key present on one side only is printed; provenance
(created, git_commit, timings, versions, cached_stages) is ignored. Exit status 1 when anything
differs: "every committed number unchanged" is then a command, not a claim.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROVENANCE = {"created", "git_commit", "timings", "versions", "cached_stages"}
TOLERANCE = 1e-6


def differences(old, new, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if key in PROVENANCE:
                continue
            if key not in old or key not in new:
                out.append(f"{path}/{key}: only in the {'working tree' if key in new else 'revision'}")
            else:
                out += differences(old[key], new[key], f"{path}/{key}")
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            out += differences(a, b, f"{path}[{i}]")
    elif isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        if abs(old - new) > TOLERANCE * max(1.0, abs(old)):
            out.append(f"{path}: {old!r} -> {new!r}")
    elif old != new:
        out.append(f"{path}: {str(old)[:60]!r} -> {str(new)[:60]!r}")
    return out


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else "HEAD"
    changed = 0
    for path in sorted((REPO / "reports").glob("*/summary.json")):
        name = path.relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=REPO, capture_output=True, text=True, check=False)
        if shown.returncode != 0:
            print(f"{name}: not in {rev}")
            changed += 1
            continue
        diffs = differences(json.loads(shown.stdout), json.loads(path.read_text()))
        print(f"{name}: {'unchanged' if not diffs else f'{len(diffs)} differences'}")
        for line in diffs[:20]:
            print(f"  {line}")
        changed += bool(diffs)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
