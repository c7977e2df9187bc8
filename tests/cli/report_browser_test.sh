#!/usr/bin/env bash
# The HTML report of `kvrt bench --matrix` in a real browser (headless Chromium): it loads with
# no console message (no script error, nothing refused by its no-fetch policy), the parsed page
# holds the charts' SVG elements, and a screenshot is not blank and shows each combination's
# colour. Skipped (exit 77) when chromium is not installed.
#   usage: report_browser_test.sh <kvrt binary> <png_stats binary> <source dir>
set -u
kvrt=$1
png_stats=$2
src=$3
browser=$(command -v chromium || command -v chromium-browser) || {
  echo "SKIP: chromium is not installed (make test installs it with apt-get; it could not be here)"
  exit 77
}
. "$(dirname "$0")/lib.sh"
cat >"$out/w.toml" <<'TOML'
[workload]
num_requests = 40
concurrency = 40
seed = 3
[workload.input]
dist = "uniform"
min = 32
max = 64
[workload.output]
dist = "uniform"
min = 16
max = 96
TOML
"$kvrt" bench --config "$src/configs/kv-bound.toml" --set device.memory=4MiB \
  --workload "$out/w.toml" --matrix kv.store=kv_bf16_paged,kv_fp8_e4m3 \
  --html-out "$out/report.html" >"$out/table.txt" 2>"$out/err.txt"
check "the matrix writes its report" test -s "$out/report.html"

# The detector first: a page that runs a script and loads an image logs console messages.
printf '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src %s"></head><body><script>1</script><img src="http://127.0.0.1:1/x.png"></body></html>' \
  "'none'" >"$out/bad.html"
"$src/bench/screenshot.sh" "$out/bad.html" "$out/bad.png" 400 300
check "console messages are seen (a page that breaks its own policy)" \
  grep -q ":CONSOLE" "$out/bad.png.log"

"$src/bench/screenshot.sh" "$out/report.html" "$out/report.png" 1240 2400
check "the report renders in chromium" test -s "$out/report.png"
check "with no console message" bash -c "! grep ':CONSOLE' '$out/report.png.log'"

timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$out/profile" \
  --dump-dom "file://$out/report.html" >"$out/dom.html" 2>/dev/null
charts=$(grep -o '<svg xmlns="http://www.w3.org/2000/svg" class="chart"' "$out/dom.html" | wc -l)
check "the parsed page has 7 charts (got $charts)" test "$charts" -eq 7
check "bars and lines are elements of the page" \
  bash -c "grep -q '<rect class=\"bar\"' '$out/dom.html' && grep -q '<polyline class=\"series\"' '$out/dom.html'"

"$png_stats" "$out/report.png" '#4e79a7' '#f28e2b' >"$out/stats.txt"
read -r _ w h < <(grep '^size' "$out/stats.txt")
nonwhite=$(sed -n 's/^nonwhite //p' "$out/stats.txt")
blue=$(sed -n 's/^color #4e79a7 //p' "$out/stats.txt")
orange=$(sed -n 's/^color #f28e2b //p' "$out/stats.txt")
echo "screenshot ${w}x${h}: $nonwhite non-white pixels, $blue of combination 1's colour, $orange of 2's"
check "the screenshot is not blank (over 3% drawn)" test "$nonwhite" -gt $((w * h * 3 / 100))
check "it shows combination 1's bars and lines" test "$blue" -gt 2000
check "and combination 2's" test "$orange" -gt 2000
exit $failed
