# Sourced by the kvrt serve scripts: start_serve runs `"$kvrt" serve --set server.port=0 ARGS`
# with its output in $out/serve.out and serve.err, and sets pid, port and url once it listens
# (up to 60 s: sanitizer builds start slowly), or port "" when it died or never listened.
start_serve() {
  "$kvrt" serve --set server.port=0 "$@" >"$out/serve.out" 2>"$out/serve.err" &
  pid=$!
  for _ in $(seq 600); do
    grep -q "^listening on" "$out/serve.out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out/serve.out")
  url=http://127.0.0.1:$port
}
