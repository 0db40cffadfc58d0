#!/usr/bin/env bash
# Rebuilds the committed example reports under reports/ from the committed checkpoints and recipes,
# with the commands the README quotes. Run it from a clean checkout after scripts/setup.sh (every
# report records the git hash it was made from). With arguments, only the named reports:
#   bash scripts/regenerate_reports.sh                       # all (about an hour on a 2-core CPU)
#   bash scripts/regenerate_reports.sh gpt2-default-quick study-width
set -euo pipefail
cd "$(dirname "$0")/.."
# this checkout's code (not whatever an editable install points at), so the reports record its commit
probe() { OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" PYTHONPATH="$PWD" "${PYTHON:-.venv/bin/python}" -m probe -q "$@"; }
report() { probe report "$@" --force --no-cache; }
# a checkpoint's evaluations under every Garg et al. prompt shift (probe/data/shifts.py), beside its eval/,
# each with the learner the model tracks there (shift_tracking.csv; probe/analysis/shift_tracking.py)
shifts() {
  for shift in random_quadrants opposite_quadrants orthogonal_train_test overlapping_train_test half_subspace skewed \
    scale_x=0.5 scale_x=2 scale_x=3 scale_y=0.5 scale_y=3 noisy; do
    probe evaluate "$1" --shift "$shift" --track --out "$1/eval-shift-${shift/=/-}" --force
  done
}
# every shipped checkpoint's error curve beside it in eval/ (checkpoints/README.md), and the ReLU
# checkpoint's curves under input-mixture, parameter-mean and length shifts (640 prompts)
evaluations() {
  for dir in $(find checkpoints -path '*/eval' -type d | sort); do
    probe evaluate "${dir%/eval}" --out "$dir" --force
  done
  local relu=checkpoints/gpt2-relu3
  for mixture in 0.5,0.5 0.7,0.3 0.9,0.1; do
    probe evaluate "$relu" --prompts 640 --mixture "$mixture" --out "$relu/eval-mixture-${mixture/,/-}" --force
  done
  probe evaluate "$relu" --prompts 640 --param-mean 0.5 --out "$relu/eval-param-mean-0.5" --force
  probe evaluate "$relu" --prompts 640 --param-mean -0.5 --out "$relu/eval-param-mean-neg0.5" --force
  probe evaluate "$relu" --prompts 640 --points 32 --out "$relu/eval-points-32" --force
}

# the trained checkpoints whose findings the README and docs/results.md quote: induced weights (the
# spectral instrument, SimW) and the test prompts on 512 prompts, the count the spectral row's
# validity domain needs at kappa = 100 (probe/stages/spectral.py SPECTRAL_DOMAIN)
WIDE="--set prompts.induced=512 --set prompts.test=512"
declare -A JOBS=(
  [gpt2-default-quick]="report checkpoints/gpt2-default --out reports/gpt2-default-quick"
  [gpt2-default-vs-lstm]="report checkpoints/gpt2-default --compare checkpoints/lstm-default --out reports/gpt2-default-vs-lstm"
  [gpt2-default-vs-d8]="report checkpoints/gpt2-default --compare checkpoints/gpt2-d8 --out reports/gpt2-default-vs-d8"
  [gpt2-illcond-quick]="report checkpoints/gpt2-illcond --out reports/gpt2-illcond-quick $WIDE"
  [gpt2-illcond-24k-quick]="report checkpoints/gpt2-illcond-24k --out reports/gpt2-illcond-24k-quick $WIDE"
  [gpt2-d8-quick]="report checkpoints/gpt2-d8 --out reports/gpt2-d8-quick $WIDE"
  [gpt2-d8-illcond-quick]="report checkpoints/gpt2-d8-illcond --out reports/gpt2-d8-illcond-quick $WIDE"
  [lstm-default-quick]="report checkpoints/lstm-default --out reports/lstm-default-quick"
  [lstm-d8-quick]="report checkpoints/lstm-d8 --out reports/lstm-d8-quick"
  [lsa-L1-d4-quick]="report checkpoints/lsa-L1-d4 --recipe lsa --out reports/lsa-L1-d4-quick"
  [lsa-L1-d8-quick]="report checkpoints/lsa-L1-d8 --recipe lsa --out reports/lsa-L1-d8-quick"
  [lsa-L4-d4-quick]="report checkpoints/lsa-L4-d4 --recipe lsa --out reports/lsa-L4-d4-quick"
  [lsa-L4-d8-quick]="report checkpoints/lsa-L4-d8 --recipe lsa --out reports/lsa-L4-d8-quick"
  [lsa-L4-d4-illcond-quick]="report checkpoints/lsa-L4-d4-illcond --recipe lsa --out reports/lsa-L4-d4-illcond-quick $WIDE"
  [gpt2-relu3-relu]="report checkpoints/gpt2-relu3 --recipe relu --out reports/gpt2-relu3-relu"
  [planted-gd-quick]="report checkpoints/planted/gd --out reports/planted-gd-quick"
  [planted-newton-quick]="report checkpoints/planted/newton --out reports/planted-newton-quick"
  [planted-newton-relu-quick]="report checkpoints/planted/newton-relu --out reports/planted-newton-relu-quick"
  [planted-sgd-quick]="report checkpoints/planted/sgd --out reports/planted-sgd-quick"
  [planted-adam-quick]="report checkpoints/planted/adam --out reports/planted-adam-quick"
  [steer-default]="probe steer checkpoints/gpt2-default --out reports/steer-default --force"
  [order-lstm]="probe order checkpoints/lstm-default --out reports/order-lstm --force"
  [line-search-default]="probe heatmap checkpoints/gpt2-default --recipe analyses/line-search.toml --out reports/line-search-default --force"
  [evaluations]="evaluations"
  [shifts-gpt2-default]="shifts checkpoints/gpt2-default"
  [shifts-lstm-default]="shifts checkpoints/lstm-default"
  [shifts-planted-gd]="shifts checkpoints/planted/gd"
  [shifts-planted-newton]="shifts checkpoints/planted/newton"
  [probes-default-converged]="probe probes checkpoints/gpt2-default --recipe full --set probes.prompts=2048 --targets xty w_ols xtx --out reports/probes-default-converged --force"
)
for study in depth-phases relu-depth training-dynamics training-dynamics-d8 training-dynamics-d8-stage depth-noiseless width relu-attention relu-transformer-depth \
  dimension dimension-illcond seeds-default seeds-d8 seeds-d8-illcond prompts-d8; do
  JOBS[study-$study]="probe study $study --out reports/study-$study --jobs 2 --force"
done

set -f  # job lines hold brackets (probes.hidden=[128]), never file patterns
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(printf '%s\n' "${!JOBS[@]}" | sort))
for name in "${names[@]}"; do
  [ -n "${JOBS[$name]:-}" ] || { echo "unknown report '$name'; known: ${!JOBS[*]}" >&2; exit 2; }
  echo "== $name: ${JOBS[$name]}"
  start=$SECONDS
  ${JOBS[$name]}
  echo "== $name done in $((SECONDS - start)) s"
done
