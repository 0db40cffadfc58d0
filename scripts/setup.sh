#!/usr/bin/env bash
# Creates .venv at the repository root and installs icl-probe in two layers:
#   bash scripts/setup.sh                  the package and what its commands need (the report's layer)
#   bash scripts/setup.sh --dev            also its pinned test and docs tools (pytest, ruff, mypy, mkdocs, ...)
#   bash scripts/setup.sh --with-browser   --dev, and Debian's Chromium for the report's browser test (needs root)
# torch is pinned to the CPU build that lies on disk on these machines (an unpinned torch
# would download a multi-GB CUDA build). Safe to re-run: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0 browser=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --with-browser) dev=1 browser=1 ;;
    *) echo "scripts/setup.sh: unknown option '$arg' (use --dev or --with-browser)" >&2; exit 2 ;;
  esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
if [ "$dev" = 1 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,docs]"
else
  .venv/bin/python -m pip install -q --disable-pip-version-check -e .
fi
.venv/bin/python -m pip check  # the pinned versions agree with every package's requirements
if [ "$browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
