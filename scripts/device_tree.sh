#!/usr/bin/env bash
# Slim the working tree for a GPU machine that is sent the checkout (64 MiB at most, where the
# committed checkpoints and reports are about 150 MB), and put it back afterwards:
#   bash scripts/device_tree.sh out    # moves checkpoints/* but gpt2-default, and reports/, to $STASH
#   bash scripts/device_tree.sh back   # moves them back
# $STASH defaults to /tmp/icl-probe-device-stash. The benchmarks the device check runs
# (benchmarks/gpu.py, gpu_profile.py, pytest -m gpu) need only checkpoints/gpt2-default.
set -eu
cd "$(dirname "$0")/.."
stash=${STASH:-/tmp/icl-probe-device-stash}
case "${1:-}" in
  out)
    if [ -e "$stash" ]; then
      echo "device_tree: $stash exists (a tree not put back?): run 'bash scripts/device_tree.sh back' first" >&2
      exit 1
    fi
    mkdir -p "$stash/checkpoints"
    for d in checkpoints/*; do
      [ "$d" = checkpoints/gpt2-default ] || mv "$d" "$stash/checkpoints/"
    done
    mv reports "$stash/"
    echo "device_tree: moved to $stash; $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes of tracked files left"
    ;;
  back)
    if [ ! -d "$stash" ]; then
      echo "device_tree: nothing to put back ($stash does not exist)" >&2
      exit 1
    fi
    mv "$stash"/checkpoints/* checkpoints/
    [ -d "$stash/reports" ] && mv "$stash/reports" .
    rm -r "$stash"
    git status --short | head -5
    echo "device_tree: put back"
    ;;
  *)
    echo "usage: bash scripts/device_tree.sh out|back" >&2
    exit 2
    ;;
esac
