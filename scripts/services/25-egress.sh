#!/usr/bin/env bash
# Egress control for the workspace tests: mitmproxy (the filtering TLS proxy) in a venv of its own
# and bubblewrap for the local sandbox backend (scripts/egress-venv.sh, installed already by
# 45-egress-venv.sh beside the engine's install), then the proxy image of ssh:// hosts.
# Idempotent: a second run installs nothing. Fails loudly when either cannot be had.
set -euo pipefail
mitmdump=$(bash "$(dirname "$0")/../egress-venv.sh")
echo "BASELINE_MITMDUMP=$mitmdump" >> "${BASELINE_CI_ENV:-/dev/null}"
# The proxy image of ssh:// hosts (this venv's mitmproxy on the base image of 20-docker.sh), built
# on the local engine, which is also the test sshd's: cached by content, so a rerun builds nothing.
BASELINE_MITMDUMP="$mitmdump" .venv/bin/python -m infra.egress.proxy_image
