#!/usr/bin/env bash
# A screenshot of an HTML file in headless Chromium (Debian's chromium package), and the page's
# console messages: any "CONSOLE" line on stderr is a message the page logged (an error, a
# refused load). Used by the report's browser test and by `make report-screenshot`.
#   usage: screenshot.sh PAGE.html OUT.png [WIDTH HEIGHT]   (stderr of chromium: OUT.png.log)
set -u
page=$1
png=$2
width=${3:-1240}
height=${4:-2400}
browser=$(command -v chromium || command -v chromium-browser) || {
  echo "screenshot.sh: chromium is not installed (apt-get install chromium)" >&2
  exit 77
}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$profile" --enable-logging=stderr --v=0 \
  --window-size="$width,$height" --screenshot="$png" "file://$(realpath "$page")" \
  >/dev/null 2>"$png.log"
status=$?
[ -s "$png" ] || { echo "screenshot.sh: no screenshot of $page (exit $status)" >&2; exit 1; }
exit 0
