#!/usr/bin/env bash
# TP over MPI when a rank goes wrong, as a user runs it (mpirun -np 2 kvrt ...), each case under
# a time limit: a rank that cannot load its plugin or its weights, or whose configuration
# differs from rank 0's, stops every rank at start-up with a message naming it; a rank that hangs
# (SIGSTOP) or dies (SIGKILL) while the server has a request in flight gets the client a 500 or
# 503 -- never a partial 200 -- and every process exits.
#   usage: mpi_faults_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun="mpirun --oversubscribe"
model=$(cd "$src/.." && pwd)/shared/models/stories260k
gen=(generate --set "model.preset=\"synth-tiny\"" --prompt Once --max-new-tokens 4)

# ---- start-up: each case must end (every rank) well within its limit, non-zero, naming rank 1.
startup_case() {  # startup_case <name> <expected text> <rank 1's extra arguments...>
  local name=$1 want=$2
  shift 2
  local t0=$SECONDS
  timeout 60 $mpirun -np 1 "$kvrt" "${gen[@]}" : -np 1 "$kvrt" "${gen[@]}" "$@" \
    >"$out/$name.out" 2>&1
  local rc=$?
  check "$name: mpirun exits non-zero, not by the time limit (rc $rc)" \
    test "$rc" -ne 0 -a "$rc" -ne 124
  check "$name: within 30 s ($((SECONDS - t0)) s)" test $((SECONDS - t0)) -lt 30
  check "$name: the message names rank 1 and the reason" grep -q "TP rank 1 of 2 .*$want" \
    "$out/$name.out"
}
startup_case plugin "failed to start: kv.store: plugin 'kv_nope' not found" \
  --set kv.store=kv_nope
startup_case mismatch "configured differently from TP rank 0 .*scheduler.page_size: rank 0 has 16, rank 1 has 1" \
  --set scheduler.page_size=1
if [ -f "$model/model.safetensors" ]; then
  mkdir -p "$out/broken-model"
  cp "$model"/* "$out/broken-model/"
  head -c 100000 "$model/model.safetensors" >"$out/broken-model/model.safetensors"
  gen=(generate --set "model.path=\"$model\"" --prompt Once --max-new-tokens 4)
  startup_case weights "failed to start: .*broken-model/model.safetensors: truncated" \
    --set "model.path=\"$out/broken-model\""
else
  echo "skipped the weights case: $model not found"
fi
# tp.size against the launcher's process count.
timeout 60 $mpirun -np 2 "$kvrt" generate --set "model.preset=\"synth-tiny\"" --set tp.size=4 \
  --prompt Once --max-new-tokens 4 >"$out/np.out" 2>&1
check "tp.size = 4 under -np 2 is refused, naming both" \
  grep -q "tp.size = 4, but the MPI launcher started 2 processes" "$out/np.out"
timeout 60 $mpirun -np 2 "$kvrt" eval --text "$src/README.md" >"$out/eval.out" 2>&1
check "kvrt eval under mpirun -np 2 is refused" \
  grep -q "kvrt eval runs in one process, but an MPI launcher started 2" "$out/eval.out"

# ---- a rank lost while serving: synth-76m decodes slowly enough to keep a request in flight.
serve_mpi() {
  $mpirun -np 2 "$kvrt" serve --set "model.preset=\"synth-76m\"" --set server.port=0 \
    --set tp.timeout_s=3 "$@" >"$out/serve.out" 2>"$out/serve.err" &
  pid=$!
  wait_listening
  rank1=$(sed -n 's/.*TP 2 over MPI: ranks 0 on .*; 1 on [^,]*, pid \([0-9]*\).*/\1/p' \
    "$out/serve.err")
}

fault_case() {  # fault_case <name> <signal> <expected text in the server's output>
  local name=$1 signal=$2 want=$3
  serve_mpi
  check "$name: the server listens, rank 1's pid is logged ($rank1)" test -n "$port" -a -n "$rank1"
  [ -n "$port" ] && [ -n "$rank1" ] || { kill "$pid" 2>/dev/null; return; }
  curl -s -o "$out/$name.json" -w '%{http_code}' "$url/generate" \
    -d '{"text": "Once", "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}' \
    >"$out/$name.code" &
  local client=$!
  sleep 1
  local t0=$SECONDS
  kill "-$signal" "$rank1"
  local ended=0
  for _ in $(seq 300); do
    kill -0 "$pid" 2>/dev/null || { ended=1; break; }
    sleep 0.1
  done
  check "$name: every process exits within 30 s of SIG$signal ($((SECONDS - t0)) s)" test "$ended" = 1
  [ "$ended" = 1 ] || { kill -KILL "$pid" "$rank1" 2>/dev/null; }
  wait "$pid" 2>/dev/null
  pid=
  wait "$client"
  local code
  code=$(cat "$out/$name.code")
  check "$name: the client's request is answered 500 or 503, not a partial 200 (got $code)" \
    test "$code" = 500 -o "$code" = 503
  check "$name: the server says why" grep -q "$want" "$out/serve.err" "$out/$name.json"
  for _ in $(seq 50); do kill -0 "$rank1" 2>/dev/null || break; sleep 0.1; done
  check "$name: no kvrt process is left" bash -c "! kill -0 $rank1 2>/dev/null"
  [ "$failed" = 0 ] || { echo "--- $name: the server's stderr"; cat "$out/serve.err"; cat "$out/$name.json"; echo; }
}
fault_case hang STOP "waited 3 s (tp.timeout_s) in .* for TP rank 1, which did not answer"
fault_case death KILL "process rank 1 .* exited on signal 9"

exit $failed
