#!/usr/bin/env bash
# kvrt eval as a user runs it, on synth-tiny (no model files): a table with a row per store, the
# f32 store against itself measuring nothing, --calibrate writing a scale file kvrt eval reads
# back, and bad input refused by name: an empty corpus, one shorter than a window, ids outside
# the vocabulary, a store that cannot load, a scale file of the wrong number of layers.
#   usage: eval_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
model=(--set model.preset=synth-tiny --set model.dtype=f32)
tiny=("${model[@]}" --ctx 64)
# 600 ids in 0..511: nine windows of 64.
seq 0 599 | awk '{print ($1 * 7919) % 512}' | tr '\n' ' ' >"$out/ids.txt"

"$kvrt" eval "${tiny[@]}" --ids "$out/ids.txt" --stores kv_f32_paged,kv_f32_paged,kv_bf16_paged \
  --json-out "$out/eval.json" >"$out/self.txt" 2>"$out/self.err"
check "kvrt eval runs" test $? -eq 0
check "9 windows of 64, 567 positions" grep -q "600 tokens, 9 windows of 64 (24 left over), 567 positions" "$out/self.txt"
check "the f32 store against itself: KL 0, top-1 100%" \
  grep -Eq '^kv_f32_paged +512 +[0-9]+ +[0-9.]+ +1\.0000 +0 +0 +0 +0 +100\.00 +0 ' "$out/self.txt"
check "bf16 beside it at half the bytes" grep -Eq '^kv_bf16_paged +256 ' "$out/self.txt"
check "the JSON names every store" test "$(grep -c '"label":' "$out/eval.json")" -eq 3

"$kvrt" eval "${tiny[@]}" --ids "$out/ids.txt" --stores kv_f32_paged \
  --calibrate kv_fp8_e4m3 --out "$out/scales.toml" >"$out/cal.txt" 2>"$out/cal.err"
check "--calibrate writes the scale file" grep -q '^\[kv.kv_fp8_e4m3.calibrated\]' "$out/scales.toml"
check "a K and a V scale per layer" grep -Eq '^k = \[[0-9.e-]+, [0-9.e-]+\]  # per layer' "$out/scales.toml"
check "and evaluates the calibrated row" \
  grep -Eq '^kv_fp8_e4m3:scale_mode=per_tensor:calibrated +128 ' "$out/cal.txt"

refused() {  # refused <pattern> <args...>: exit 1 and the message on stderr
  local pattern=$1
  shift
  "$kvrt" eval "${model[@]}" "$@" >"$out/r.out" 2>"$out/r.err"
  local rc=$?
  [ $rc -eq 1 ] && grep -q -- "$pattern" "$out/r.err" || { echo "  rc $rc: $(cat "$out/r.err")"; false; }
}
: >"$out/empty.txt"
printf '\n  \n\n' >"$out/blank.txt"
echo "1 2 3 4 5" >"$out/short.txt"
echo "1 2 512 4" >"$out/outside.txt"
echo "1 2 x3 4" >"$out/word.txt"
ctx=(--ctx 64)
check "an empty corpus" refused "kvrt: $out/empty.txt: the corpus is empty" --ids "$out/empty.txt" "${ctx[@]}"
check "a text corpus of blank lines" refused "kvrt: $out/blank.txt: the corpus is empty" --text "$out/blank.txt" "${ctx[@]}"
check "a corpus shorter than one window" \
  refused "kvrt: $out/short.txt: 5 tokens, fewer than one window of 64" --ids "$out/short.txt" "${ctx[@]}"
check "an id outside the vocabulary" \
  refused "kvrt: $out/outside.txt: token 3 is id 512, outside the model's vocabulary 0..511" \
  --ids "$out/outside.txt" "${ctx[@]}"
check "a word that is not an id" refused "token 3 'x3' is not an integer id" --ids "$out/word.txt" "${ctx[@]}"
check "a missing corpus" refused "$out/nope.txt: cannot open" --ids "$out/nope.txt" "${ctx[@]}"
check "a store that cannot load" refused "kvrt: store kv_nope: kv.store: plugin 'kv_nope' not found" \
  --ids "$out/ids.txt" --stores kv_f32_paged,kv_nope
check "a store option it refuses" refused "scale_mode: expected" \
  --ids "$out/ids.txt" --stores kv_f32_paged,kv_fp8_e4m3:scale_mode=bogus
check "--ctx beyond the model's context" refused "kvrt: --ctx 4096: expected 2..2048" \
  --ids "$out/ids.txt" --ctx 4096
check "--calibrate of a store that reads no scales" \
  refused "kvrt: --calibrate kv_bf16_paged: only kv_fp8_e4m3 reads calibrated scales" \
  --ids "$out/ids.txt" --calibrate kv_bf16_paged --out "$out/x.toml"

# Scale files of the wrong shape: synth-tiny has 2 layers.
printf '[kv.kv_fp8_e4m3.calibrated]\nk = [0.1, 0.1, 0.1]\nv = [0.01, 0.01, 0.01]\n' >"$out/three.toml"
printf '[kv.kv_fp8_e4m3.calibrated]\nk = [0.1]\nv = [0.01]\n' >"$out/one.toml"
printf '[kv.kv_fp8_e4m3.calibrated]\nk = [0.1, -2]\nv = [0.01, 0.01]\n' >"$out/negative.toml"
printf '[kv.kv_fp8_e4m3]\nscale_mode = "per_tensor"\n' >"$out/noscales.toml"
check "a scale for a layer the model lacks" \
  refused "calibrated.k\[2\]: a scale for layer 2, but the model has 2 layers (0..1)" \
  --ids "$out/ids.txt" --stores kv_f32_paged --scales "$out/three.toml"
check "no scale for a layer" \
  refused "calibrated.k: no scale for layer 1 (the model has 2 layers, the table 1 scales)" \
  --ids "$out/ids.txt" --stores kv_f32_paged --scales "$out/one.toml"
check "a negative scale names its layer" \
  refused "calibrated.k\[1\] (layer 1): expected a positive finite number" \
  --ids "$out/ids.txt" --stores kv_f32_paged --scales "$out/negative.toml"
check "a file without scales" refused "no \[kv.<store>.calibrated\] table" \
  --ids "$out/ids.txt" --stores kv_f32_paged --scales "$out/noscales.toml"
exit $failed
