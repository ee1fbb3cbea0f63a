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
# --no-compile: byte-compiling every installed module took most of the install's time on a 2-core
# machine; Python compiles (and caches) the modules actually imported, on first import.
.venv/bin/pip install -q --no-compile -e ".[$extras]"
