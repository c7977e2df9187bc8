#!/usr/bin/env bash
# `kvrt bench --url` against `kvrt serve` (synth-bench, no model files needed): the same workload
# gives the same token counts as the in-process bench over each backend, multi-turn runs over
# /generate, the server's record_trace replays in process, and bad uses are refused by name.
#   usage: bench_url_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
cat >"$out/w.toml" <<'TOML'
[workload]
num_requests = 24
concurrency = 8
seed = 5
[workload.input]
dist = "fixed"
value = 40
[workload.output]
dist = "fixed"
value = 12
TOML
cat >"$out/turns.toml" <<'TOML'
[workload]
num_requests = 12
turns = 3
concurrency = 4
seed = 2
[workload.input]
dist = "fixed"
value = 20
[workload.output]
dist = "fixed"
value = 8
TOML
config=$src/configs/kv-bound.toml
start_serve --config "$config" --set "server.record_trace=\"$out/recorded.jsonl\""
check "kvrt serve listens" test -n "$port"

"$kvrt" bench --config "$config" --workload "$out/w.toml" >"$out/local.txt" 2>/dev/null
check "the in-process bench runs" grep -q "24 completed, 0 aborted of 24" "$out/local.txt"
for backend in generate openai; do
  "$kvrt" bench --url "$url" --backend $backend --workload "$out/w.toml" \
    >"$out/$backend.txt" 2>"$out/$backend.err"
  check "--backend $backend: every request completed" \
    grep -q "24 completed, 0 aborted of 24" "$out/$backend.txt" ||
    { grep -E "^requests|aborted because|^ " "$out/$backend.txt"; tail -5 "$out/$backend.err"
      tail -5 "$out/serve.err"; }
  check "--backend $backend: 960 prompt and 288 generated tokens, as in process" \
    grep -q "960 prompt, 288 generated" "$out/$backend.txt"
  check "--backend $backend: the report names the server and its store" \
    bash -c "grep -q '^server .*$url' '$out/$backend.txt' && grep -q 'KV store *kv_bf16_paged' '$out/$backend.txt'"
  check "--backend $backend: the server's diagnosis" grep -q "^Diagnosis: .*the server's" "$out/$backend.txt"
done
check "the in-process bench: 960 prompt and 288 generated tokens" \
  grep -q "960 prompt, 288 generated" "$out/local.txt"
# The Responses API takes text: the prompts go through /detokenize and the chat template (so
# more prompt tokens), the answers are as long.
"$kvrt" bench --url "$url" --backend responses --workload "$out/w.toml" \
  >"$out/responses.txt" 2>"$out/responses.err"
check "--backend responses: every request completed" \
  grep -q "24 completed, 0 aborted of 24" "$out/responses.txt" || tail -5 "$out/responses.err"
check "--backend responses: 288 generated tokens, as in process" \
  grep -q "prompt, 288 generated" "$out/responses.txt"
check "--backend responses: the report names /v1/responses" \
  grep -q "POST /v1/responses, streamed" "$out/responses.txt"

# Back-to-back one-token requests on keep-alive connections: none may be taken for a
# disconnect (a wait left from the previous exchange once aborted the next one).
sed -e 's/num_requests = 4000/num_requests = 1500/' "$src/bench/workloads/trivial.toml" >"$out/trivial.toml"
"$kvrt" bench --url "$url" --workload "$out/trivial.toml" >"$out/trivial.txt" 2>&1
check "1500 one-token requests on 64 keep-alive connections all complete" \
  grep -q "1500 completed, 0 aborted of 1500" "$out/trivial.txt"

"$kvrt" bench --url "$url" --workload "$out/turns.toml" >"$out/turns.txt" 2>&1
check "multi-turn over /generate: 12 requests completed" \
  grep -q "12 completed, 0 aborted of 12" "$out/turns.txt"
check "later turns found the conversation cached" \
  bash -c "! grep -q ' 0 cached' '$out/turns.txt'"
"$kvrt" bench --url "$url" --backend openai --workload "$out/turns.toml" >"$out/o.txt" 2>&1
check "multi-turn over openai is refused (exit 1)" test $? -eq 1
check "saying to use --backend generate" grep -q "use --backend generate" "$out/o.txt"
"$kvrt" bench --url "$url" --config "$config" --workload "$out/w.toml" >"$out/c.txt" 2>&1
check "--url with --config is refused" test $? -eq 1
check "saying which to give" grep -q "give one or the other" "$out/c.txt"
"$kvrt" bench --url http://127.0.0.1:1 --workload "$out/w.toml" >"$out/u.txt" 2>&1
check "an unreachable server is exit 1" test $? -eq 1
check "naming the address" grep -q "cannot connect to 127.0.0.1:1" "$out/u.txt"
"$kvrt" bench --url https://127.0.0.1:1 --workload "$out/w.toml" >"$out/s.txt" 2>&1
check "https is refused by name" grep -q "https is not supported" "$out/s.txt"

check "no page held after the runs" \
  bash -c "curl -s '$url/metrics' | grep -qx 'kvrt:num_used_tokens 0'"
check "a POST /flush_cache empties the cache" \
  bash -c "curl -s -X POST '$url/flush_cache' | grep -q '\"success\":true'"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
check "SIGTERM exits 0" test $rc -eq 0

# The traffic the server recorded, replayed in process.
check "record_trace wrote one line per request (24 + 24 + 24 + 1500 + 12)" \
  test "$(wc -l <"$out/recorded.jsonl")" -eq 1584
"$kvrt" bench --config "$config" --trace "$out/recorded.jsonl" >"$out/replay.txt" 2>/dev/null
check "the recorded trace replays in process" grep -q "1584 completed, 0 aborted of 1584" "$out/replay.txt"
exit $failed
