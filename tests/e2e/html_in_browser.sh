#!/usr/bin/env bash
# Renders membill's HTML page in headless Chromium and checks that the chart and the bill are
# on the page a browser builds. Exits 77 (skipped) when no browser is installed.
set -euo pipefail
membill=$1 golden=$2
command -v chromium >/dev/null || { echo "chromium not installed: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$membill" train --weights "$golden/tiny_tied" --html "$dir/page.html" --quiet
timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$dir/profile" --dump-dom "file://$dir/page.html" > "$dir/dom.html" 2>/dev/null
grep -q '<svg' "$dir/dom.html"
grep -q 'polygon' "$dir/dom.html"
grep -q 'four copies' "$dir/dom.html"
grep -q 'held at the total peak' "$dir/dom.html"
timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$dir/profile" --window-size=1100,900 --screenshot="$dir/page.png" "file://$dir/page.html" 2>/dev/null
[ -s "$dir/page.png" ]
echo "rendered: chart and bill present"
