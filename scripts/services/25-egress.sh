#!/usr/bin/env bash
# Egress control for the workspace tests: mitmproxy (the filtering TLS proxy) in a venv of its own,
# because its pinned dependencies clash with the main venv's; bubblewrap for the local sandbox
# backend. Idempotent: a second run installs nothing. Fails loudly when either cannot be had.
set -euo pipefail
venv="${BASELINE_EGRESS_VENV:-/opt/baseline-egress-venv}"
python="${BASELINE_EGRESS_PYTHON:-$(command -v python3)}"
if ! command -v bwrap >/dev/null 2>&1; then
  bash "$(dirname "$0")/../apt-install.sh" bubblewrap
fi
bwrap --version
if ! "$venv/bin/mitmdump" --version >/dev/null 2>&1; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "mitmproxy>=10,<13"
fi
version=$("$venv/bin/mitmdump" --version)
echo "${version%%$'\n'*}"
echo "BASELINE_MITMDUMP=$venv/bin/mitmdump" >> "${BASELINE_CI_ENV:-/dev/null}"
# The proxy image of ssh:// hosts (this venv's mitmproxy on the base image of 20-docker.sh), built
# on the local engine, which is also the test sshd's: cached by content, so a rerun builds nothing.
BASELINE_MITMDUMP="$venv/bin/mitmdump" .venv/bin/python -m infra.egress.proxy_image
