#!/usr/bin/env bash
# JupyterHub's proxy for the hub tests: configurable-http-proxy from the npm registry (pinned),
# installed globally only when missing or at another version. JupyterHub itself is a Python
# dependency (pyproject.toml); the workspace image carries JupyterLab and jupyterhub-singleuser.
set -euo pipefail
version=5.3.0
if ! command -v npm >/dev/null 2>&1; then
  bash "$(dirname "$0")/../apt-install.sh" nodejs npm
fi
current=$(configurable-http-proxy --version 2>/dev/null || true)
if [ "$current" != "$version" ]; then
  echo "installing configurable-http-proxy@$version (found: ${current:-none})"
  npm install -g --no-fund --no-audit "configurable-http-proxy@$version" >/dev/null
fi
chp=$(command -v configurable-http-proxy) || { echo "configurable-http-proxy is not on PATH after npm install" >&2; exit 1; }
got=$("$chp" --version)
[ "$got" = "$version" ] || { echo "configurable-http-proxy is $got, wanted $version" >&2; exit 1; }
echo "configurable-http-proxy $got at $chp"
echo "BASELINE_HUB_PROXY_CMD=$chp" >> "${BASELINE_CI_ENV:-/dev/null}"
