#!/usr/bin/env bash
# Creates .venv at the repository root and installs icl-probe with its test and docs extras.
# torch is pinned to the CPU build that lies on disk on these machines (an unpinned torch
# would download a multi-GB CUDA build). Safe to re-run: it only installs what is missing.
#   --with-browser   also install Debian's Chromium for the report's browser test (needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,docs]"
.venv/bin/python -m pip check  # the pinned versions agree with every package's requirements
if [ "${1:-}" = "--with-browser" ] && ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
