#!/usr/bin/env bash
# Regenerate the initial migration from the models (only while the project has no deployments).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f baseline/migrations/versions/*.py
tmp=$(mktemp -d)
.venv/bin/python - "$tmp" <<'PY'
import sys
from alembic import command
from baseline.migrate import alembic_config
cfg = alembic_config(f"sqlite:///{sys.argv[1]}/gen.db")
command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
PY
rm -rf "$tmp"
.venv/bin/ruff format -q baseline/migrations/versions/ || true
