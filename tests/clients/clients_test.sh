#!/usr/bin/env bash
# The npm openai package, the Vercel AI SDK and LangChain (clients_test.mjs) against `kvrt
# serve` on stories260k: completions, chat, streaming, logprobs, n = 2 and the Responses API.
# The packages are an install step (`make test-deps` runs npm ci on tests/clients/package.json
# into BUILD/npm-clients); without node, the packages or the model, the test is skipped, saying
# which. It downloads nothing.   usage: clients_test.sh <kvrt binary> <source dir> <build dir>
set -u
kvrt=$1
src=$2
clients=$3/npm-clients
. "$src/tests/cli/lib.sh"
model=$(cd "$src/.." && pwd)/shared/models/stories260k
if ! command -v node >/dev/null; then
  echo "skipped: node is not installed"
  exit 0
fi
for p in openai ai @ai-sdk/openai @langchain/openai; do
  if [ ! -d "$clients/node_modules/$p" ]; then
    echo "skipped: $clients/node_modules/$p is absent (make test-deps installs the clients)"
    exit 0
  fi
done
if [ ! -f "$model/model.safetensors" ]; then
  echo "skipped: $model not found"
  exit 0
fi
start_serve --set "model.path=\"$model\""
check "kvrt serve listens" test -n "$port"
# Next to its node_modules, where node's module resolution finds the packages.
cp "$src/tests/clients/clients_test.mjs" "$clients/clients_test.mjs"
node "$clients/clients_test.mjs" "$url" || failed=1
kill -TERM "$pid"; wait "$pid"; pid=
exit $failed
