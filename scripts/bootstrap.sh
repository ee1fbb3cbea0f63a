#!/usr/bin/env bash
# Create the virtual environment and install Baseline with the extras named (default: dev, i.e.
# development and test tools). `make demo` installs only the `demo` extra: less to install on a
# fresh machine before the demo runs.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[$extras]"
