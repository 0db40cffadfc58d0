"""Re-render committed reports and study pages from their own files after a change of presentation
only (page layout, figure style, table cells): figures and index.html are drawn again, no analysis
re-runs, summary.json and data/ stay as they are. Run from the repository root of a clean checkout
(each page records the git hash it was rendered at):

    .venv/bin/python scripts/rerender_reports.py                 # every folder under reports/
    .venv/bin/python scripts/rerender_reports.py gpt2-d8-quick study-width

A change of numbers or of the words in summary.json needs scripts/regenerate_reports.sh instead."""

from __future__ import annotations

import sys
from pathlib import Path

from probe.reporting.rerender import rerender_report
from probe.study.present import rerender as rerender_study
from probe.study.recipe import resolve_study

REPORTS = Path("reports")


def main(names: list[str]) -> int:
    folders = [REPORTS / name for name in names] or sorted(p for p in REPORTS.iterdir() if p.is_dir())
    for folder in folders:
        if folder.name.startswith("study-"):
            rerender_study(folder, resolve_study(folder.name.removeprefix("study-")))
        elif (folder / "summary.json").is_file() and (folder / "recipe.json").is_file():
            rerender_report(folder)
        else:  # a single analysis command's output (order, probes, steering): no page to render
            print(f"skipped {folder}: not a report or a study", flush=True)
            continue
        print(f"re-rendered {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
