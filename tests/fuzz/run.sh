#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each and prints executions per target.
#   tests/fuzz/run.sh BIN_DIR SECONDS [TARGET...]
# Each target starts from its seeds (tests/fuzz/corpus/<name>/, plus the repository's own files of
# that kind) and keeps what it finds in BIN_DIR/../fuzz-corpus/<name>/. A crash, leak, timeout
# or out-of-memory leaves its input in BIN_DIR/../fuzz-artifacts/ and fails the run.
set -uo pipefail
bin=$1
seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(cd "$bin/.." && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config model_config safetensors safetensors_index workload trace matrix corpus_ids
           plugin_file generate_body chat_template tokenizer tiktoken)
fi
# The repository's own files of each kind are seeds too (not copied: libFuzzer reads them).
extra_seeds() {
  case $1 in
    config) echo "$root/configs" ;;
    workload) echo "$root/bench/workloads" ;;
  esac
}
mkdir -p "$work/fuzz-artifacts"
# Targets run FUZZ_JOBS at a time (default: one per core), each on one core for SECONDS, so a
# 2-core machine spends half the wall time of running them one after another.
jobs=${FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1 corpus="$work/fuzz-corpus/$1"
  rm -f "$work/fuzz-artifacts/$t.rc"
  mkdir -p "$corpus"
  # -rss_limit_mb: a parser that reads without a bound fails here, not on the machine.
  # -timeout: one input taking over 10 s is a hang.
  "$bin/fuzz_$t" "$corpus" "$here/corpus/$t" $(extra_seeds "$t") -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$work/fuzz-artifacts/$t-" >"$work/fuzz-artifacts/$t.log" 2>&1
  echo $? >"$work/fuzz-artifacts/$t.rc"
}
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
failed=0
total=0
printf '%-20s %12s %12s %10s\n' target executions "exec/s" result
for t in "${targets[@]}"; do
  log="$work/fuzz-artifacts/$t.log"
  rc=$(cat "$work/fuzz-artifacts/$t.rc" 2>/dev/null || echo missing)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (rc $rc, see $log)"
    failed=1
    # What a reader of CI's output needs to reproduce it: the report and the input itself.
    grep -v -E '^(#[0-9]+|INFO:|  NEW_FUNC)' "$log" | tail -40
    for a in "$work/fuzz-artifacts/$t"-*; do
      [ -f "$a" ] || continue
      echo "input $(basename "$a") ($(stat -c %s "$a") bytes), base64:"
      head -c 4096 "$a" | base64 -w 100
    done
  fi
  printf '%-20s %12s %12s %10s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
  total=$((total + ${execs:-0}))
done
printf '%-20s %12s\n' all "$total"
exit $failed
