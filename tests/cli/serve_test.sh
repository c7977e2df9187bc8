#!/usr/bin/env bash
# `kvrt serve` as a user runs it, spoken to with curl: /generate's greedy ids equal `kvrt
# generate`'s, a bad body is a 400 naming the field, and SIGTERM with a request in flight
# answers it and exits 0.   usage: serve_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
model=$(cd "$src/.." && pwd)/shared/models/stories260k
if [ ! -f "$model/model.safetensors" ]; then
  echo "skipped: $model not found"
  exit 0
fi
start_serve --set "model.path=\"$model\"" --set server.shutdown_grace_s=5
check "kvrt serve prints the port it listens on" test -n "$port"

"$kvrt" generate --set "model.path=\"$model\"" --ignore-eos --prompt "Once upon a time" \
  --max-new-tokens 27 -v >/dev/null 2>"$out/gen.err"
want=$(sed -n 's/^generated ids: //p' "$out/gen.err" | tr ' ' ',')
curl -s "$url/generate" -d '{"text": "Once upon a time", "sampling_params": {"max_new_tokens": 27, "ignore_eos": true, "temperature": 0}}' \
  >"$out/gen.json"
check "/generate's output_ids equal kvrt generate's" grep -q "\"output_ids\":\[$want\]" "$out/gen.json"

code=$(curl -s -o "$out/bad.json" -w '%{http_code}' "$url/generate" \
  -d '{"text": "hi", "sampling_params": {"top_p": 2}}')
check "a bad top_p is a 400" test "$code" = 400
check "naming sampling_params.top_p" grep -q '"param":"sampling_params.top_p"' "$out/bad.json"
check "/health is 200" test "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200
check "/metrics is Prometheus text" bash -c "curl -s '$url/metrics' | grep -q '^kvrt:num_running_reqs'"
check "/metrics has SGLang's names too" bash -c \
  "curl -s '$url/metrics' | grep -q '^sglang:num_running_reqs{model_name=\".*stories260k\"}'"
curl -s "$url/server_info" >"$out/server_info.json"
check "/server_info has the version" grep -q '"version":"[0-9]' "$out/server_info.json"
check "/server_info has max_req_input_len" grep -q '"max_req_input_len":[0-9]' \
  "$out/server_info.json"
curl -s "$url/model_info" >"$out/model_info.json"
check "/model_info lists the architectures" grep -q '"architectures":\["LlamaForCausalLM"\]' \
  "$out/model_info.json"
check "/model_info has model_type" grep -q '"model_type":"llama"' "$out/model_info.json"

# A long request in flight, then SIGTERM: it finishes within the grace period, exit 0.
curl -s "$url/generate" -d '{"input_ids": [1, 403], "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}' \
  >"$out/long.json" &
client=$!
sleep 0.2
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
wait "$client"
check "SIGTERM exits 0" test $rc -eq 0
check "the request in flight got its answer" grep -q '"completion_tokens"' "$out/long.json"
check "the log says it stopped" grep -q "kvrt serve: stopped" "$out/serve.err"
# A chat template kvrt cannot render stops the server at start-up, naming the file; "default"
# (or a template file) in [server] chat_template serves anyway, and /get_server_info says which.
mkdir -p "$out/bad-template"
for f in config.json model.safetensors tokenizer.model; do ln -s "$model/$f" "$out/bad-template/$f"; done
echo "{% include 'other.jinja' %}" >"$out/bad-template/chat_template.jinja"
"$kvrt" serve --set "model.path=\"$out/bad-template\"" --set server.port=0 \
  >"$out/refused.out" 2>"$out/refused.err"
check "an unrenderable template stops kvrt serve" test $? -ne 0
check "naming the file" grep -q "chat_template.jinja" "$out/refused.err"
check "and the way out" grep -q '\[server\] chat_template' "$out/refused.err"
start_serve --set "model.path=\"$out/bad-template\"" --set 'server.chat_template="default"'
check "chat_template = \"default\" serves it" test -n "$port"
check "/get_server_info names the default" bash -c \
  "curl -s '$url/get_server_info' | grep -q 'as \[server\] chat_template says'"
kill -TERM "$pid"; wait "$pid"; pid=
exit $failed
