#!/usr/bin/env bash
# `kvrt bench --matrix` as a user runs it (synth-bench, no model files): the table has a row per
# combination, a combination that fails is reported in its row while the others run, --json-out
# and --html-out write their files, and an invalid value is refused by name before anything runs.
#   usage: bench_matrix_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
base=(--set model.preset=synth-bench --set model.dtype=bf16 --workload "$src/tests/cli/tight-pool.toml")

"$kvrt" bench "${base[@]}" --matrix kv.store=kv_bf16_paged,kv_fp8_e4m3 \
  --matrix device.memory=13MiB,3MiB --repeat 2 --json-out "$out/m.json" \
  --html-out "$out/m.html" >"$out/table.txt" 2>"$out/err.txt"
check "a matrix with one failed combination exits 0" test $? -eq 0
check "the table has a row per combination, in product order" \
  grep -Eq '^1 +kv_bf16_paged +13MiB +9152 ' "$out/table.txt"
check "row 2 (bf16 on 3 MiB) is reported as failed" \
  grep -Eq '^2 +kv_bf16_paged +3MiB +- .*failed$' "$out/table.txt"
check "its reason is named" \
  grep -q '^2 kv.store=kv_bf16_paged device.memory=3MiB: failed: every request of the workload was aborted (6)' \
  "$out/table.txt"
check "the others still ran (fp8 on 3 MiB: 256 tokens)" \
  grep -Eq '^4 +kv_fp8_e4m3 +3MiB +256 ' "$out/table.txt"
check "ratios to row 1" grep -Eq '^3 +kv_fp8_e4m3 +13MiB +1\.88x ' "$out/table.txt"
check "8 runs, interleaved" test "$(grep -c 'run [0-9]/8' "$out/err.txt")" -eq 8
check "round 2 starts at combination 2" \
  grep -q 'run 5/8 (kv.store=kv_bf16_paged device.memory=3MiB, run 2)' "$out/err.txt"
check "no progress bar when stderr is not a terminal" bash -c "! grep -q '\[#' '$out/err.txt'"
check "JSON and HTML are written" grep -q "^HTML report: $out/m.html" "$out/table.txt"
check "the JSON holds every run" \
  test "$(grep -c '"position":' "$out/m.json")" -eq 8
check "the HTML has its charts" test "$(grep -c '<svg xmlns="http://www.w3.org/2000/svg" class="chart"' "$out/m.html")" -ge 7
check "the HTML runs no script" bash -c "! grep -qi '<script' '$out/m.html'"

# --eval-text: each combination's store against exact f32 KV on a corpus, in the same table.
for i in $(seq 40); do echo "Once upon a time there was a little cat that liked to sit in the sun."; done >"$out/corpus.txt"
"$kvrt" bench "${base[@]}" --matrix kv.store=kv_bf16_paged,kv_fp8_e4m3 --eval-text "$out/corpus.txt" \
  --eval-ctx 128 --json-out "$out/e.json" >"$out/eval.txt" 2>"$out/eval.err"
check "--eval-text adds KL and top-1 columns" grep -Eq '^# .* KL mean +KL p99 +top-1 % +verdict$' "$out/eval.txt"
check "bf16's KL is below fp8's" awk '/^ratio/ { exit }
  $2 == "kv_bf16_paged" { b = $(NF-3) } $2 == "kv_fp8_e4m3" { f = $(NF-3) }
  END { exit !(b + 0 < f + 0 && b + 0 > 0) }' "$out/eval.txt"
check "the JSON has the accuracy figures" grep -q '"kl_mean":' "$out/e.json"

# Refusals, each before the first run.
refused() {  # refused <pattern> <args...>: exit 1, the message on stderr, nothing ran
  local pattern=$1
  shift
  "$kvrt" bench "${base[@]}" "$@" >"$out/r.out" 2>"$out/r.err"
  [ $? -eq 1 ] && grep -q -- "$pattern" "$out/r.err" && ! grep -q "run 1/" "$out/r.err"
}
check "an unknown store is named with --matrix" \
  refused "kvrt: --matrix kv.store=kv_nope: " --matrix kv.store=kv_bf16_paged,kv_nope
check "a value out of range is named" \
  refused "kvrt: --matrix tp.size=9: tp.size: expected an integer between 1 and 8, found 9" \
  --matrix tp.size=1,9
check "a store option the store refuses is named" \
  refused "kvrt: --matrix kv.kv_fp8_e4m3.scale_mode=bogus: " \
  --set kv.store=kv_fp8_e4m3 --matrix kv.kv_fp8_e4m3.scale_mode=per_tensor,bogus
check "an unknown key is named" refused "kvrt: --matrix scheduler.nope=1: " --matrix scheduler.nope=1,2
check "a combination that fails only as a whole is named" \
  refused "kvrt: --matrix combination 4 of 4 (device.memory=3.5MiB scheduler.page_size=1024): " \
  --matrix device.memory=13MiB,3.5MiB --matrix scheduler.page_size=16,1024
check "a key given twice" refused "the key is given twice" --matrix tp.size=1 --matrix tp.size=2
check "an empty value" refused "kvrt: --matrix tp.size=1,,2: value 2 is empty" --matrix tp.size=1,,2
check "--repeat 0" refused "kvrt: --repeat 0: expected 1.." --repeat 0
check "an --eval-text that cannot be read" \
  refused "kvrt: --eval-text: $out/missing.txt: cannot open" --matrix tp.size=1 --eval-text "$out/missing.txt"
check "--matrix with --url" refused "do not go with --url" --url http://127.0.0.1:1 --matrix tp.size=1,2

exit $failed
