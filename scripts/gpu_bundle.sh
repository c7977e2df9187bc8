#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs, for a GPU machine that has the CUDA toolkit but none of
# kvrt's Debian packages and no network (this workplace's device machines): the CUDA tests,
# kvrt, the plugins and attention_cuda_bench from a build here (KVRT_CUDA on), stripped; the
# shared libraries they load except the C/C++ runtime and CUDA's own (cuBLAS and NCCL come from
# the GPU machine's toolkit or Python packages); and the models the tests read. Then:
#   scripts/gpu_check.sh --bundle gpu-bundle/bundle.tar.xz
# on the GPU machine runs the same check without building.
#   usage: scripts/gpu_bundle.sh [BUILD_DIR] [OUT]   (defaults: build, gpu-bundle/bundle.tar.xz)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-bundle/bundle.tar.xz}
cmake -S . -B "$build" -DKVRT_CUDA=ON >/dev/null
tests=$(cmake --build "$build" --target help | sed -n 's/^\.\.\. \(.*cuda.*_test\|nccl_group_test\)$/\1/p')
plugins="kv_bf16_paged kv_f32_paged kv_fp8_e4m3 kv_host_tiered attn_cpu attn_cuda"
cmake --build "$build" -j"$(nproc)" --target $tests kvrt attention_cuda_bench $plugins

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/models"
for t in $tests kvrt attention_cuda_bench; do cp "$build/bin/$t" "$stage/bin/"; done
for p in $plugins; do cp "$build/bin/$p.so" "$stage/bin/"; done
strip --strip-unneeded "$stage"/bin/*
# Every library the binaries load, but the ones any Linux with a CUDA driver and toolkit has.
system='^(linux-vdso|ld-linux|libc\.|libm\.|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda\.|libcublas|libcublasLt|libnccl|libcudart)'
for f in "$stage"/bin/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $system ]] || cp -L "$path" "$stage/lib/$name"
done
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true
for m in stories260k tiny-deepseek-v3; do
  [ -d "../shared/models/$m" ] && cp -r "../shared/models/$m" "$stage/models/"
done
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" bin lib models
echo "$out: $(du -h "$out" | cut -f1) ($(ls "$stage/bin" | wc -l) binaries and plugins," \
     "$(ls "$stage/lib" | wc -l) libraries, models: $(ls "$stage/models" | tr '\n' ' '))"
