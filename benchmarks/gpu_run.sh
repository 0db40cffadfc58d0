#!/usr/bin/env bash
# The device check (benchmarks/gpu.py and gpu_smoke.py) as one command on a CUDA machine, from the repository root:
#   bash benchmarks/gpu_run.sh OUTDIR [--paper-scale]
# Where the machine's Python lacks this project's dependencies, put their wheels in .whl/ first
# (docs/guide/development.md says which); they are installed into a scratch directory, not the system.
# Writes OUTDIR/gpu_smoke.json (every command on CUDA), OUTDIR/gpu_results.json (benchmarks/gpu.py)
# and the logs of both.
set -u
out=${1:?usage: bash benchmarks/gpu_run.sh OUTDIR [--paper-scale]}
shift
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, transformers, transformer_lens; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" || exit 1
timeout "${SMOKE_SECONDS:-150}" python3 benchmarks/gpu_smoke.py --device cuda ${SMOKE_ONLY:+--only $SMOKE_ONLY} --out "$out/gpu_smoke.json" 2>&1 | tee "$out/smoke.log" | grep -E '^[a-z_]+: exit|^smoke_failed|Error'
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_path.py 2>&1 | tail -3
timeout "${CHECK_SECONDS:-300}" python3 benchmarks/gpu.py --devices cpu cuda --out "$out/gpu_results.json" "$@" 2>&1 | tee "$out/gpu.log" | tail -20
