#!/usr/bin/env bash
# The GPU check (issue 17), for a machine with one NVIDIA GPU: builds kvrt (Release, CUDA on),
# runs every CUDA test -- each compares a device path with the CPU path's results: the stores'
# device writes, paged attention against attn_cpu, the CUDA backend's ops against the CPU
# backend's, NCCL against the threads' communicator, stories260k's greedy ids on the GPU against
# the CPU's with each store -- then the benchmarks, and writes everything as JSON:
#   - attention_cuda_bench: decode attention's effective KV bandwidth through the stores' device
#     pools and attn_cuda, as a fraction of a device-to-device copy measured in the same run
#     (goals: 0.8 for bf16 at 16K context, batch 32; fp8 1.7x bf16's tokens/s);
#   - kvrt bench on the GPU: decode tokens/s of synth-76m and synth-llama3-8b at batch 1, 64 and
#     256 with each store (--matrix kv.store=...).
#   usage: scripts/gpu_check.sh [--bundle FILE] [OUT_DIR]   (default OUT_DIR build-gpu/check;
#          it gets gpu_check.json, the summary with every part's JSON in it, and gpu_check.log)
# It builds with what `make deps` installs and the CUDA toolkit at /usr/local/cuda. A GPU machine
# without kvrt's Debian packages (and no network to get them) runs a bundle made here instead
# (--bundle; scripts/gpu_bundle.sh makes it): the binaries, the libraries they need but cuBLAS
# and NCCL, which come from the GPU machine, and the models. Budget: 8 minutes on an H200 with
# 16 cores, the build included; each step has a time limit so a hang cannot eat the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=""
if [ "${1:-}" = "--bundle" ]; then
  bundle=$(realpath "$2")
  shift 2
fi
out=${1:-build-gpu/check}
build=build-gpu
start=$(date +%s)
mkdir -p "$build" "$out"
out=$(cd "$out" && pwd)
# OUT_DIR gets the summary and the log only (a device tool may bring back few files); each
# part's own JSON stays in $build/check-parts, and the summary holds them all.
parts=$PWD/$build/check-parts
mkdir -p "$parts"
log=$out/gpu_check.log
: >"$log"
elapsed() { echo $(($(date +%s) - start)); }

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>>"$log" |
      head -1)
echo "GPU: ${gpu:-none found}"
if [ -n "$bundle" ]; then
  tar -C "$build" -xJf "$bundle" || { echo "cannot unpack $bundle"; exit 1; }
  # cuBLAS and NCCL of this machine: the toolkit's, or its Python packages'.
  cuda_libs=""
  for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(find /usr/local/cuda*/ /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
    [ -n "$found" ] && cuda_libs="$cuda_libs:$(dirname "$found")"
    [ -n "$found" ] || echo "warning: $lib not found on this machine" | tee -a "$log"
  done
  export LD_LIBRARY_PATH="$PWD/$build/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The tests read the models from ../shared/models beside the repository, as here.
  for m in "$build"/models/*; do
    [ -e "../shared/models/$(basename "$m")" ] || { mkdir -p ../shared/models && cp -r "$m" ../shared/models/; }
  done
  targets=$(cd "$build/bin" && ls | grep -E 'cuda.*_test$|^nccl_group_test$' | tr '\n' ' ')
  echo "unpacked $bundle: $targets"
else
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVRT_CUDA=ON -DKVRT_BUILD_BENCH=ON \
    >>"$log" 2>&1 || { echo "configure failed (see $log)"; exit 1; }
  # The CUDA tests, what they load, the benchmark and kvrt itself; not the whole suite.
  targets=$(cmake --build "$build" --target help 2>/dev/null |
            sed -n 's/^\.\.\. \(.*cuda.*_test\|nccl_group_test\)$/\1/p' | tr '\n' ' ')
  timeout 300 cmake --build "$build" -j"$(nproc)" --target $targets kvrt attention_cuda_bench \
    kv_bf16_paged kv_f32_paged kv_fp8_e4m3 kv_host_tiered attn_cpu attn_cuda \
    >>"$log" 2>&1 || { echo "build failed (see $log)"; exit 1; }
fi
built=$(elapsed)
echo "ready in ${built} s: $targets"

status=0
tests_json=()
for t in $targets; do
  json=$parts/$t.json
  KVRT_SOURCE_DIR=$PWD timeout 120 "$build/bin/$t" --gtest_output="json:$json" >>"$log" 2>&1 ||
    status=1
  [ -f "$json" ] && tests_json+=("$json")
  echo "$t: $(grep -c '"result": "COMPLETED"' "$json" 2>/dev/null) run," \
       "$(grep -c '"failure"' "$json" 2>/dev/null) failures, $(grep -c '"SKIPPED"\|"skipped"' "$json" 2>/dev/null) skipped"
done
# A GPU the CUDA runtime cannot use (a driver older than the toolkit's) would skip every device
# test rather than fail one: that is a failed check, not a clean one.
if [ -n "$gpu" ] && grep -q "no CUDA device" "$log"; then
  echo "nvidia-smi sees a GPU but the CUDA tests skipped it: $(grep -m1 -o 'no CUDA device[^(]*' "$log")"
  status=1
fi
echo "tests done at $(elapsed) s"

bench_json=$parts/attention_cuda_bench.json
timeout 90 "$build/bin/attention_cuda_bench" --benchmark_format=console \
  --benchmark_out="$bench_json" --benchmark_out_format=json 2>&1 | tee -a "$log" |
  grep -E '^BM_|^-' || status=1
echo "attention benchmark done at $(elapsed) s"

# Decode tokens/s end to end, every store in one --matrix per model and batch. The host tier's
# pool is pinned on a GPU (it cannot overcommit), so it gets a fixed 16 GiB, not twice the
# device pool.
e2e_json=()
for model in synth-76m synth-llama3-8b; do
  for batch in 1 64 256; do
    json=$parts/e2e_${model}_b${batch}.json
    timeout 150 "$build/bin/kvrt" bench --set 'device.kind="cuda"' \
      --set 'attention.backend="attn_cuda"' --set 'device.memory="120GiB"' \
      --set "model.preset=\"$model\"" --workload "bench/workloads/decode-${batch}x128.toml" \
      --set 'kv.kv_host_tiered.host_pool_gib=16' \
      --matrix kv.store=kv_bf16_paged,kv_fp8_e4m3,kv_host_tiered --json-out "$json" \
      >>"$log" 2>&1 || status=1
    [ -f "$json" ] && e2e_json+=("$json")
    echo "$model batch $batch done at $(elapsed) s"
  done
done

join() {  # the files as one JSON array
  local first=1
  echo "["
  for f in "$@"; do
    [ $first -eq 1 ] || echo ","
    first=0
    cat "$f"
  done
  echo "]"
}
{
  echo "{"
  echo "  \"gpu\": \"${gpu}\","
  echo "  \"build_seconds\": ${built},"
  echo "  \"total_seconds\": $(elapsed),"
  echo "  \"passed\": $([ $status -eq 0 ] && echo true || echo false),"
  echo "  \"tests\": $(join "${tests_json[@]}"),"
  echo "  \"attention_bench\": $([ -f "$bench_json" ] && cat "$bench_json" || echo null),"
  echo "  \"e2e\": $(join "${e2e_json[@]}")"
  echo "}"
} >"$out/gpu_check.json"
echo "wrote $out/gpu_check.json ($(elapsed) s in all); log: $log"
exit $status
