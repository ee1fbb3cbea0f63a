#!/usr/bin/env bash
# Run the whole test suite: start every service the tests need (scripts/services/*.sh, in order),
# then lint, type-check and pytest. A service that cannot start fails the run; nothing is skipped
# silently.
set -euo pipefail
cd "$(dirname "$0")/.."
export BASELINE_CI_ENV="${BASELINE_CI_ENV:-$PWD/.ci-env}"
# Each step's start time is printed, so that a slow run shows where its time went.
step() { echo "== $(date -u +%H:%M:%S) $*"; }
: > "$BASELINE_CI_ENV"
for service in scripts/services/*.sh; do
  [ -e "$service" ] || continue
  step "service: $service"
  bash "$service"
done
# What an earlier run that failed or was stopped left on this machine's engine (the machine may
# be reused) is removed first, so that the leak check below speaks of this run only.
step "leftovers of earlier runs"
bash scripts/leak-check.sh --clean || true
set -a
# shellcheck disable=SC1090
source "$BASELINE_CI_ENV"
set +a
export BASELINE_REQUIRE_SERVICES=1
# Browser tests keep a screenshot of the pages they visit here (the CI artifact).
export BASELINE_SCREENSHOTS="${BASELINE_SCREENSHOTS:-$PWD/.ci-artifacts/screenshots}"
step ruff
.venv/bin/ruff check .
step mypy
.venv/bin/mypy
step pytest
status=0
# The slowest tests are listed, and every test's time is kept in .ci-artifacts/pytest.xml, so
# that the run's time can be watched.
.venv/bin/pytest -p no:cacheprovider --durations=25 --junitxml=.ci-artifacts/pytest.xml "$@" || status=$?
step "leak check"
bash scripts/leak-check.sh || status=1
step "done (exit $status)"
exit $status
