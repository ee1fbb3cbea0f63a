#!/usr/bin/env bash
# Headless Chromium for static figure export (kaleido) and the portal's browser tests (selenium
# through chromedriver). Installs Debian's chromium and chromium-driver when missing, checks that
# the browser really renders a page, and tells the tests where it is.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  bash "$(dirname "$0")/../apt-install.sh" "${need[@]}"
fi
browser=$(command -v chromium) || { echo "chromium is not installed and could not be installed" >&2; exit 1; }
driver=$(command -v chromedriver) || { echo "chromedriver is not installed and could not be installed" >&2; exit 1; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
dom=$(timeout 60 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --dump-dom 'data:text/html,<p id="ok">rendered</p>' 2>/dev/null) || true
if ! grep -q 'id="ok"' <<<"$dom"; then
  echo "chromium at $browser did not render a test page" >&2
  exit 1
fi
echo "chromium ready: $("$browser" --version 2>/dev/null | head -1)"
{
  echo "BROWSER_PATH=$browser"
  echo "BASELINE_CHROMEDRIVER=$driver"
} >> "$BASELINE_CI_ENV"
