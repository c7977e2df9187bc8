# Sourced by the command-line test scripts (after setting kvrt): a scratch folder $out,
# removed with the server (if still running) on exit; check DESCRIPTION COMMAND..., which prints
# ok/FAILED and sets failed=1; and start_serve, which runs `"$kvrt" serve --set server.port=0 ARGS`
# with its output in $out/serve.out and serve.err, and sets pid, port and url once it listens
# (up to 60 s: sanitizer builds start slowly), or port "" when it died or never listened;
# wait_listening is its second half, for a server started otherwise (under mpirun).
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
failed=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failed=1; fi
}

start_serve() {
  "$kvrt" serve --set server.port=0 "$@" >"$out/serve.out" 2>"$out/serve.err" &
  pid=$!
  wait_listening
}

# After starting a server as $pid (writing $out/serve.out): waits until it listens, then sets
# port and url (port "" when it died or never listened).
wait_listening() {
  for _ in $(seq 600); do
    grep -q "^listening on" "$out/serve.out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out/serve.out")
  url=http://127.0.0.1:$port
}
