#!/usr/bin/env bash
# TP-2 over MPI beside TP-2 over threads and TP-1, on one machine, interleaved in one run: decode
# at batch 1 and at batch 64 (128 prompt + 128 output tokens each, synth-76m), with the time and
# bytes of TP communication per decode step (kvrt bench's report).
#   usage: bench/tp_mpi.sh [kvrt binary] [rounds]
set -eu
kvrt=${1:-build/bin/kvrt}
rounds=${2:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=(--set 'model.preset="synth-76m"')
run() {  # run <label> <workload> <tp.size> <launcher and kvrt...>
  local label=$1 workload=$2 tp=$3
  shift 3
  local report
  report=$("$@" bench "${model[@]}" --set "tp.size=$tp" \
    --workload "bench/workloads/$workload.toml" 2>&1) || {
    echo "$label: failed"; echo "$report" | tail -5; return 1; }
  local step comm itl
  step=$(echo "$report" | sed -n 's/^decode step, mean (ms) *//p')
  itl=$(echo "$report" | sed -n 's/^ITL (ms) *mean [0-9.]*  p50 \([0-9.]*\).*/\1/p')
  comm=$(echo "$report" | sed -n 's/^TP communication per decode step *//p')
  printf '%-14s %-22s decode step %8s ms  ITL p50 %8s ms  %s\n' "$workload" "$label" "$step" \
    "$itl" "${comm:--}"
}
for r in $(seq "$rounds"); do
  for w in decode-1x128 decode-64x128; do
    run "TP-1" "$w" 1 "$kvrt"
    run "TP-2 threads" "$w" 2 "$kvrt"
    run "TP-2 mpi" "$w" 2 mpirun -np 2 "$kvrt"
  done
done
