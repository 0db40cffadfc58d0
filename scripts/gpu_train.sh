#!/usr/bin/env bash
# Trains replication seeds and Fu et al.'s width on one GPU inside one time-limited call, and packs
# the runs into $OUT as archives small enough to come back (each under 15 MiB; a larger one split).
#   OUT=/tmp/out BUDGET=420 bash scripts/gpu_train.sh
# Runs, concurrently on the one GPU (python3 with CUDA torch, this checkout on PYTHONPATH):
#   gpt2-d8-seed2, gpt2-d8-illcond-seed2: the recipes as they are (30,000 steps), --device cuda;
#   gpt2-d8-width256: recipes/gpt2-d8.toml at Fu et al. 2024's width (12 layers, 256 wide, 8 heads),
#     a 200-step pilot, then a cosine schedule sized to the time left (at most 30,000 steps).
# A run the budget cuts short keeps its last saved state (train_state.pt; save_every 500) to resume
# on any machine with `icl-probe train --out DIR --resume`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
start=$(date +%s)
budget=${BUDGET:-420}
deadline=$((start + budget))
py=${PYTHON:-python3}
runs=/tmp/gpu-runs
mkdir -p "$runs" "$OUT"
train() { # name, seconds, args...
  local name=$1 seconds=$2; shift 2
  timeout "$seconds" "$py" -m probe -q train --device "${DEVICE:-cuda}" --out "$runs/$name" --force "$@" >"$runs/$name.log" 2>&1
  echo "$name exit $? after $(($(date +%s) - start)) s" | tee -a "$OUT/gpu_train.log"
}
"$py" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/gpu_train.log"
left=$((deadline - $(date +%s) - 40))
train gpt2-d8-seed2 "$left" --recipe recipes/gpt2-d8.toml --set train.seed=2 &
train gpt2-d8-illcond-seed2 "$left" --recipe recipes/gpt2-d8-illcond.toml --set train.seed=2 &
wide=(--recipe recipes/gpt2-d8.toml --set model.n_embd=256 --set model.n_head=8 --set train.seed=0)
t0=$(date +%s)
train width-pilot 120 "${wide[@]}" --set train.steps=200 --set train.save_every=200 --set train.eval_every=200
per_step=$("$py" -c "print(max(1e-3, ($(date +%s) - $t0 - 10) / 200))")
left=$((deadline - $(date +%s) - 40))
steps=$("$py" -c "print(max(1000, min(30000, int($left / $per_step * 0.85))))")
echo "width: $per_step s/step in the pilot, $steps steps in $left s" | tee -a "$OUT/gpu_train.log"
[ "$left" -gt 60 ] && train gpt2-d8-width256 "$left" "${wide[@]}" --set train.steps="$steps" &
wait
for name in gpt2-d8-seed2 gpt2-d8-illcond-seed2 gpt2-d8-width256; do
  [ -f "$runs/$name/config.json" ] || continue
  cp "$runs/$name.log" "$runs/$name/gpu.log"
  # a finished run needs no optimizer state; the wide run's (76 MB) cannot come back either way
  "$py" - "$runs/$name" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
conf = json.loads((run / "config.json").read_text())
done = conf["meta"]["train_step"] >= conf["config"]["train"]["steps"]
print(run.name, "step", conf["meta"]["train_step"], "of", conf["config"]["train"]["steps"])
if done or "width" in run.name:
    (run / "train_state.pt").unlink(missing_ok=True)
PY
  tar -C "$runs" -cf "/tmp/$name.tar" "$name"
  split -b 15m -d "/tmp/$name.tar" "$OUT/$name.tar.part"
done
ls -l "$OUT" | tee -a "$OUT/gpu_train.log"
