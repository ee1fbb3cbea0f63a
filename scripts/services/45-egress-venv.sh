#!/usr/bin/env bash
# The egress proxy's venv and bubblewrap (scripts/egress-venv.sh), installed while the Docker
# Engine is: they need no engine, and 25-egress.sh then only builds the proxy image.
set -euo pipefail
bash "$(dirname "$0")/../egress-venv.sh" > /dev/null
