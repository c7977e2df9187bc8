#!/usr/bin/env bash
# The GPU check (issue 17), for a machine with one NVIDIA GPU: builds kvrt (Release, CUDA on),
# runs every CUDA test -- which compare the device paths with the CPU path's results -- and
# writes what ran and its figures as JSON.
#   usage: scripts/gpu_check.sh [OUT_JSON]   (default build-gpu/gpu_check.json)
# It needs only what `make deps` installs and the CUDA toolkit at /usr/local/cuda. So far the
# CUDA tests are the device KV write paths and paged attention against attn_cpu
# (tests/kernels/cuda/); the script runs whatever
# binaries match *_cuda_test, so new ones join without editing it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/gpu_check.json}
build=build-gpu
start=$(date +%s)
mkdir -p "$build" "$(dirname "$out")"
log=$build/gpu_check.log
: >"$log"

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>>"$log" |
      head -1)
echo "GPU: ${gpu:-none found}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVRT_CUDA=ON -DKVRT_BUILD_BENCH=OFF \
  >>"$log" 2>&1 || { echo "configure failed (see $log)"; exit 1; }
# The CUDA tests and the plugins they compare against; not the whole suite.
targets=$(cmake --build "$build" --target help 2>/dev/null | sed -n 's/^\.\.\. \(.*_cuda_test\)$/\1/p' | tr '\n' ' ')
cmake --build "$build" -j"$(nproc)" --target $targets kv_bf16_paged kv_f32_paged kv_fp8_e4m3 attn_cpu \
  >>"$log" 2>&1 || { echo "build failed (see $log)"; exit 1; }
built=$(($(date +%s) - start))
echo "built in ${built} s: $targets"

status=0
results=()
for t in $targets; do
  json=$build/$t.json
  KVRT_SOURCE_DIR=$PWD "$build/bin/$t" --gtest_output="json:$json" >>"$log" 2>&1 || status=1
  results+=("$json")
  grep -E '"(name|result|time)"' "$json" | paste - - - | sed 's/[",]//g; s/  */ /g' | head -20
done

{
  echo "{"
  echo "  \"gpu\": \"${gpu}\","
  echo "  \"build_seconds\": ${built},"
  echo "  \"total_seconds\": $(($(date +%s) - start)),"
  echo "  \"passed\": $([ $status -eq 0 ] && echo true || echo false),"
  echo "  \"tests\": ["
  first=1
  for json in "${results[@]}"; do
    [ $first -eq 1 ] || echo ","
    first=0
    cat "$json"
  done
  echo "  ]"
  echo "}"
} >"$out"
echo "wrote $out ($(($(date +%s) - start)) s in all); log: $log"
exit $status
