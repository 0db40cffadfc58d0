#!/usr/bin/env bash
# Builds the documentation site (docs/, mkdocs.yml) into site/ (or the directory given): API
# reference from the docstrings, the CLI reference from the parser, numbers read from the committed
# reports, the notebook executed. Warnings are errors (mkdocs --strict), a macro that fails fails the
# build, and every internal link must name a file (scripts/check_site_links.py). The output is not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_MKDOCS_2_WARNING=1 MPLBACKEND=Agg
.venv/bin/mkdocs build --strict --quiet -d "${1:-site}"
.venv/bin/python scripts/check_site_links.py "${1:-site}"  # every internal link a file: it opens from disk
echo "documentation built in ${1:-site}/index.html"
