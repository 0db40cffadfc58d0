#!/usr/bin/env bash
# Builds the documentation site (docs/, mkdocs.yml) into site/ (or the directory given): API
# reference from the docstrings, the CLI reference from the parser, numbers read from the committed
# reports, the notebook executed. Warnings are errors (mkdocs --strict). The output is not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_MKDOCS_2_WARNING=1 MPLBACKEND=Agg
.venv/bin/mkdocs build --strict --quiet -d "${1:-site}"
echo "documentation built in ${1:-site}/index.html"
