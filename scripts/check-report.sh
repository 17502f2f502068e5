#!/usr/bin/env bash
# Renders kvgate's HTML report in a headless browser and checks that it
# shows as a page with its plots (issue 13). Installs Debian's chromium
# when missing. Writes the screenshot next to the report.
#
#   scripts/check-report.sh [report.html]   (default: runs a short demo first)
set -euo pipefail
cd "$(dirname "$0")/.."
report=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$report" ]; then
  report="$tmp/demo.html"
  go run ./cmd/kvgate demo --duration 5 --rate 20 --time-scale 5 --runs 1,4 --report "$report" >/dev/null
fi
if ! command -v chromium >/dev/null; then
  (apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y chromium >/dev/null))
fi
abs=$(readlink -f "$report")
dom=$(chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$abs" 2>/dev/null)
svgs=$(grep -o '<svg' <<<"$dom" | wc -l)
lines=$(grep -o '<polyline' <<<"$dom" | wc -l)
shot="${abs%.html}.png"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1600 --screenshot="$shot" "file://$abs" >/dev/null 2>&1
echo "rendered $abs: $svgs plots, $lines series; screenshot $shot"
[ "$svgs" -ge 3 ] && [ "$lines" -ge 3 ] && grep -q 'id="summary"' <<<"$dom"
