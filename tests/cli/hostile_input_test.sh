#!/usr/bin/env bash
# Hostile but realistic input through the command line (issue 11): each case must be refused
# with an exit code of 1 or 2 (never a signal, never 0) and a message naming the file, field or
# plugin; nothing may hang (every command runs under a timeout).
#   usage: hostile_input_test.sh <kvrt> <kvrt-conformance> <broken plugin dir> <source dir>
set -u
kvrt=$1
conformance=$2
broken=$3
src=$4
model=$(cd "$src/.." && pwd)/shared/models/stories260k
out=$(mktemp -d)
writers=()
trap 'kill "${writers[@]}" 2>/dev/null; rm -rf "$out"' EXIT
failed=0

# refused <behaviour> <pattern the message must hold> <command...>
refused() {
  local what=$1 pattern=$2
  shift 2
  timeout 60 "$@" >"$out/stdout" 2>"$out/stderr"
  local rc=$?
  if [ $rc -eq 124 ]; then
    echo "FAILED: $what: hung (killed after 60 s)"; failed=1
  elif [ $rc -eq 0 ] || [ $rc -gt 2 ]; then
    echo "FAILED: $what: exit code $rc"; sed 's/^/    /' "$out/stderr" | tail -5; failed=1
  elif ! grep -qF -- "$pattern" "$out/stderr"; then
    echo "FAILED: $what: the message lacks '$pattern':"; sed 's/^/    /' "$out/stderr"; failed=1
  else
    echo "ok: $what"
  fi
}

# accepted <behaviour> <pattern stdout+stderr must hold> <command...>
accepted() {
  local what=$1 pattern=$2
  shift 2
  timeout 60 "$@" >"$out/stdout" 2>"$out/stderr"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAILED: $what: exit code $rc"; sed 's/^/    /' "$out/stderr" | tail -5; failed=1
  elif ! cat "$out/stdout" "$out/stderr" | grep -qF -- "$pattern"; then
    echo "FAILED: $what: the output lacks '$pattern'"; failed=1
  else
    echo "ok: $what"
  fi
}

# ---- crashes: truncated plugin libraries ---------------------------------------------------
plugins=$(dirname "$kvrt")
mkdir -p "$out/plugins"
head -c 20000 "$plugins/kv_bf16_paged.so" >"$out/plugins/kv_truncated.so"
refused "a truncated plugin given to kvrt-conformance is refused, not a SIGBUS" \
  "kv_truncated.so: not a loadable shared library: truncated" \
  "$conformance" --plugin "$out/plugins/kv_truncated.so"
refused "a truncated plugin given as kv.store is refused, not a SIGBUS" \
  "kv_truncated.so: not a loadable shared library: truncated" \
  "$kvrt" generate --set "kv.store=$out/plugins/kv_truncated.so" --prompt hi
accepted "a truncated plugin in the search path is listed as not loaded by kvrt plugins" \
  "not loaded: $out/plugins/kv_truncated.so: not a loadable shared library: truncated" \
  env KVRT_PLUGIN_PATH="$out/plugins:$plugins" "$kvrt" plugins
accepted "a truncated plugin in the search path does not stop kvrt capacity" \
  "kv_bf16_paged" env KVRT_PLUGIN_PATH="$out/plugins:$plugins" "$kvrt" capacity
mkfifo "$out/plugins/kv_fifo.so"
accepted "a FIFO in the search path is refused by kvrt plugins without blocking" \
  "kv_fifo.so: the plugin library is a FIFO, not a regular file" \
  env KVRT_PLUGIN_PATH="$out/plugins:$plugins" "$kvrt" plugins
rm -f "$out/plugins/kv_fifo.so"
echo "not a library" >"$out/text.so"
refused "a text file as a plugin is refused with one clean reason" \
  "text.so: not a loadable shared library: not an ELF file: it does not start with the ELF magic bytes" \
  "$conformance" --plugin "$out/text.so"

# ---- crashes: endless input files ----------------------------------------------------------
refused "an endless config (/dev/zero) is refused at the config's limit" \
  "/dev/zero: the configuration file is larger than kvrt's limit of 4 MiB for it" \
  "$kvrt" config check /dev/zero
refused "an endless workload is refused at the workload's limit" \
  "/dev/zero: the workload file is larger than kvrt's limit of 4 MiB for it" \
  "$kvrt" bench --workload /dev/zero
refused "an endless trace is refused at the trace's limit" \
  "/dev/zero: the trace is larger than kvrt's limit of 256 MiB for it" \
  "$kvrt" bench --trace /dev/zero
mkfifo "$out/fifo.toml"
yes 'x = 1' >"$out/fifo.toml" 2>/dev/null &
writers+=($!)
refused "a FIFO fed forever as the config is refused at the config's limit" \
  "fifo.toml: the configuration file is larger than kvrt's limit of 4 MiB for it" \
  "$kvrt" config check "$out/fifo.toml"
mkdir -p "$out/zero-model"
ln -s /dev/zero "$out/zero-model/config.json"
refused "an endless config.json is refused at its limit" \
  "config.json: the model config.json is larger than kvrt's limit of 16 MiB for it" \
  "$kvrt" generate --set "model.path=\"$out/zero-model\"" --prompt hi
refused "an endless config.json is refused by kvrt capacity too" \
  "the model config.json is larger than kvrt's limit of 16 MiB" \
  "$kvrt" capacity --model "$out/zero-model"

# ---- hangs: time values ----------------------------------------------------------------------
printf '[workload]\nnum_requests = 4\nrequest_rate = 1e-9\n' >"$out/slow.toml"
refused "a tiny request_rate is refused, not slept on" \
  "slow.toml:3:16: workload.request_rate: 4 requests at" \
  "$kvrt" bench --workload "$out/slow.toml"
printf '{"timestamp": 1e300, "input_len": 4, "output_len": 2}\n' >"$out/far.jsonl"
refused "a huge trace timestamp is refused, not turned into an overflowing sleep" \
  'far.jsonl:1: "timestamp": expected seconds in [0, 86400]' \
  "$kvrt" bench --trace "$out/far.jsonl"
printf '{"timestamp": 0, "input_len": 99999999999, "output_len": 2}\n' >"$out/long.jsonl"
refused "a trace length over 2^20 is refused before it is narrowed" \
  'long.jsonl:1: "input_len": expected an integer in [1, 1048576]' \
  "$kvrt" bench --trace "$out/long.jsonl"
printf '[workload]\nnum_requests = 10000000\n[workload.input]\nvalue = 1048576\n' >"$out/huge.toml"
refused "a workload whose prompts would not fit in memory is refused" \
  "huge.toml: workload.num_requests: 10000000 requests of up to 1048576 prompt tokens" \
  "$kvrt" bench --workload "$out/huge.toml"

# ---- stores that do not describe their memory ------------------------------------------------
refused "a store whose layout reaches outside its memory is refused at create" \
  "plugin kv_wrong_stride: layout(" \
  env -u KVRT_VERIFY_PLUGINS "$kvrt" generate --set "kv.store=$broken/kv_wrong_stride.so" --prompt hi
aliased=(--set "kv.store=$broken/kv_wrong_stride.so" --set kv.kv_wrong_stride.bug=aliased_pages)
accepted "a store whose layout stays inside its memory but lies runs without verification" "" \
  env -u KVRT_VERIFY_PLUGINS "$kvrt" generate "${aliased[@]}" --prompt hi --max-new-tokens 2
refused "--verify-plugins refuses a store that fails its conformance suite" \
  "kv_wrong_stride.so) fails" \
  env -u KVRT_VERIFY_PLUGINS "$kvrt" generate "${aliased[@]}" --prompt hi --verify-plugins
refused "KVRT_VERIFY_PLUGINS=1 (as in the tests) refuses it too" \
  "conformance properties; first: " \
  env KVRT_VERIFY_PLUGINS=1 "$kvrt" generate "${aliased[@]}" --prompt hi

# ---- accepted silently before ----------------------------------------------------------------
printf '[kv]\nstore = "kv_host_tiered"\n[kv.kv_host_tiered]\nhost_pool_ratio = -1.0\n' \
  >"$out/ratio.toml"
refused "a plugin option the store refuses is named with file:line:col at run time" \
  "ratio.toml:4:19: plugin kv_host_tiered: page_bytes failed (CONFIG): host_pool_ratio" \
  "$kvrt" generate --config "$out/ratio.toml" --prompt hi
printf '[kv]\nstore = "kv_host_tiered"\n[kv.kv_host_tiered]\nhost_pool_ratoi = 1.0\n' \
  >"$out/typo.toml"
refused "an unknown plugin option is refused at run time as by config check" \
  "typo.toml:4:1: unknown key 'kv.kv_host_tiered.host_pool_ratoi' (did you mean" \
  "$kvrt" generate --config "$out/typo.toml" --prompt hi
printf '[workload]\nnum_requests = 3\n[workload.input]\nvalue = 5000\n[workload.output]\nvalue = 4\n' \
  >"$out/too-long.toml"
refused "a bench in which every request is aborted exits 1 and says why" \
  "every request of the workload was aborted (3): nothing was measured; most often: max_new_tokens: 5000 prompt tokens + 4 max_new_tokens = 5004 tokens exceed the model's context of 2048 tokens" \
  "$kvrt" bench --workload "$out/too-long.toml" --set model.preset=synth-tiny
check_report() { grep -q "Diagnosis: every request was aborted (3 of 3)" "$out/stdout"; }
if check_report; then echo "ok: and its report's diagnosis says so instead of idle"; else
  echo "FAILED: the report's diagnosis does not say every request was aborted"; failed=1; fi
refused "generate --max-new-tokens -3 is refused by name" "max_new_tokens: expected 0 or more, found -3" \
  "$kvrt" generate --prompt hi --max-new-tokens -3

if [ -f "$model/model.safetensors" ]; then
  # A model directory whose config.json cuts a field past 32 bits, and one whose tokenizer
  # has more pieces than the model has rows.
  for case in heads vocab; do
    mkdir -p "$out/$case"
    ln -s "$model/model.safetensors" "$out/$case/model.safetensors"
    ln -s "$model/tokenizer.model" "$out/$case/tokenizer.model"
  done
  sed 's/"num_key_value_heads": *[0-9]*/"num_key_value_heads": 4294967296/' "$model/config.json" \
    >"$out/heads/config.json"
  sed 's/"vocab_size": *[0-9]*/"vocab_size": 300/' "$model/config.json" >"$out/vocab/config.json"
  refused "2^32 KV heads in config.json are refused, not cut to 0" \
    "config.json: num_key_value_heads: out of range: expected an integer in 0..2147483647" \
    "$kvrt" generate --set "model.path=\"$out/heads\"" --prompt hi
  refused "a tokenizer larger than the model's vocabulary is refused at load" \
    "tokenizer.model: the tokenizer has 512 pieces, more than the model's vocab_size 300" \
    "$kvrt" generate --set "model.path=\"$out/vocab\"" --prompt hi
else
  echo "skipped the model-directory cases: $model not found"
fi

# DeepSeek-V3 (MLA + MoE): a router kvrt does not implement, and a config with more experts
# than its checkpoint holds, are refused naming the field and the first tensor that disagrees.
deepseek=$(dirname "$model")/tiny-deepseek-v3
if [ -f "$deepseek/model.safetensors" ]; then
  for case in router expert; do
    mkdir -p "$out/ds-$case"
    ln -s "$deepseek/tokenizer.model" "$out/ds-$case/tokenizer.model"
  done
  ln -s "$deepseek/model.safetensors" "$out/ds-router/model.safetensors"
  sed 's/"scoring_func": *"sigmoid"/"scoring_func": "softmax"/' "$deepseek/config.json" \
    >"$out/ds-router/config.json"
  refused "a DeepSeek-V3 router kvrt does not implement is refused by name" \
    "config.json: scoring_func: unsupported 'softmax' (DeepSeek-V3: sigmoid)" \
    "$kvrt" generate --set "model.path=\"$out/ds-router\"" --prompt hi
  # One more routed expert than the checkpoint holds: the router is the first to disagree.
  ln -s "$deepseek/model.safetensors" "$out/ds-expert/model.safetensors"
  sed 's/"n_routed_experts": *8/"n_routed_experts": 9/' "$deepseek/config.json" \
    >"$out/ds-expert/config.json"
  refused "a DeepSeek-V3 config with more experts than its checkpoint names the tensor" \
    "tensor 'model.layers.1.mlp.gate.weight': expected shape [9, 64], found [8, 64]" \
    "$kvrt" generate --set "model.path=\"$out/ds-expert\"" --prompt hi
else
  echo "skipped the DeepSeek-V3 cases: $deepseek not found"
fi
exit $failed
