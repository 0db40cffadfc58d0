#!/usr/bin/env bash
# Trains on one GPU inside one time-limited call and packs the runs into $OUT as archives small
# enough to come back (each part under 15 MiB).
#   OUT=/tmp/out BUDGET=460 RESUME="gpt2-d8-illcond-seed1" WIDTH_LRS="2.5e-4 1e-4" bash scripts/gpu_train.sh
# Runs, concurrently on the one GPU (python3 with CUDA torch, this checkout on PYTHONPATH):
#   RESUME: each named run under checkpoints/ continued from its committed train_state.pt
#     (`icl-probe train --resume`), as far as the budget allows;
#   WIDTH_LRS: recipes/gpt2-d8.toml at Fu et al. 2024's width (12 layers, 256 wide, 8 heads), one run
#     per learning rate, named gpt2-d8-width256-lr<LR>: a 200-step pilot times a step, then each
#     run's cosine schedule is sized to the time left (at most 30,000 steps).
# A resumed run the budget cuts short keeps its last saved state (train_state.pt; save_every 500)
# to resume on any machine. A finished run's optimizer state is dropped; a wide run's weights come
# back in bfloat16 (model.bf16.safetensors: 19 MB instead of 38 MB), its optimizer state not at all.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
budget=${BUDGET:-420}
deadline=$((start + budget))
py=${PYTHON:-python3}
runs=/tmp/gpu-runs
mkdir -p "$runs" "$OUT"
log() { echo "$*" | tee -a "$OUT/gpu_train.log"; }
train() { # name, seconds, args...
  local name=$1 seconds=$2; shift 2
  timeout "$seconds" "$py" -m probe -q train --device "${DEVICE:-cuda}" --out "$runs/$name" "$@" >"$runs/$name.log" 2>&1
  log "$name exit $? after $(($(date +%s) - start)) s"
}
"$py" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no cuda')" | tee "$OUT/gpu_train.log"
names=()
left=$((deadline - $(date +%s) - 30))
for name in ${RESUME:-}; do
  cp -r "checkpoints/$name" "$runs/$name"
  names+=("$name")
  train "$name" "$left" --resume &
done
if [ -n "${WIDTH_LRS:-}" ]; then
  wide=(--recipe recipes/gpt2-d8.toml --set model.n_embd=256 --set model.n_head=8 --set train.seed=0)
  train width-pilot 120 "${wide[@]}" --force --set train.steps=200 --set train.save_every=200 --set train.eval_every=200
  # seconds per step from the pilot's own log (its elapsed_s counts steps, not the process's start-up,
  # which took 23 of the 30 s a 200-step pilot ran for beside three other runs on an H200)
  per_step=$(awk -F, 'NR > 1 { s = $1; t = $6 } END { print (s > 0 ? t / s : 1) }' "$runs/width-pilot/train_log.csv")
  left=$((deadline - $(date +%s) - 30))
  steps=$("$py" -c "print(min(30000, int($left / $per_step * 0.9)))")
  # the recipe's curriculum reaches d = 8 at step 6,000 and 36 points at 7,200: fewer steps never train the full task
  log "width: $per_step s/step in the pilot, $steps steps in $left s"
  [ "$steps" -lt 9000 ] && log "width: $steps steps end before the curriculum's last stage has 1,800 steps; not started" && left=0
  for lr in $WIDTH_LRS; do
    name=gpt2-d8-width256-lr$lr
    names+=("$name")
    [ "$left" -gt 60 ] && train "$name" "$left" "${wide[@]}" --force --set train.lr="$lr" --set train.steps="$steps" &
  done
fi
wait
for name in "${names[@]}"; do
  [ -f "$runs/$name/config.json" ] || continue
  cp "$runs/$name.log" "$runs/$name/gpu.log"
  "$py" - "$runs/$name" <<'PY'
import json, pathlib, sys
from safetensors.torch import load_file, save_file
import torch
run = pathlib.Path(sys.argv[1])
conf = json.loads((run / "config.json").read_text())
done = conf["meta"]["train_step"] >= conf["config"]["train"]["steps"]
print(run.name, "step", conf["meta"]["train_step"], "of", conf["config"]["train"]["steps"])
if done or "width" in run.name:
    (run / "train_state.pt").unlink(missing_ok=True)
if "width" in run.name:
    weights = load_file(run / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}, run / "model.bf16.safetensors")
    (run / "model.safetensors").unlink()
PY
  tar -C "$runs" -cf "/tmp/$name.tar" "$name"
  split -b 15m -d "/tmp/$name.tar" "$OUT/$name.tar.part"
done
ls -l "$OUT" | tee -a "$OUT/gpu_train.log"
