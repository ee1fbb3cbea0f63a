#!/usr/bin/env bash
# bubblewrap (the local sandbox backend) and mitmproxy (the filtering TLS proxy) in a venv of its
# own, because its pinned dependencies clash with the main venv's. Idempotent, and one install at
# a time: 45-egress-venv.sh runs it beside the Docker Engine's install, 25-egress.sh again (a
# no-op by then) before it builds the proxy image. Prints the venv's mitmdump.
set -euo pipefail
venv="${BASELINE_EGRESS_VENV:-/opt/baseline-egress-venv}"
python="${BASELINE_EGRESS_PYTHON:-$(command -v python3)}"
exec 9>/var/lock/baseline-egress-venv.lock
flock 9
if ! command -v bwrap >/dev/null 2>&1; then
  bash "$(dirname "$0")/apt-install.sh" bubblewrap >&2
fi
bwrap --version >&2
if ! "$venv/bin/mitmdump" --version >/dev/null 2>&1; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "mitmproxy>=10,<13" >&2
fi
version=$("$venv/bin/mitmdump" --version)
echo "${version%%$'\n'*}" >&2
echo "$venv/bin/mitmdump"
