#!/usr/bin/env bash
# Run the whole test suite: start every service the tests need (scripts/services/*.sh, in order),
# with lint, type-check and import contracts beside them, then pytest. A service that cannot
# start fails the run; nothing is skipped silently.
set -euo pipefail
cd "$(dirname "$0")/.."
export BASELINE_CI_ENV="${BASELINE_CI_ENV:-$PWD/.ci-env}"
# Each step's start time is printed, so that a slow run shows where its time went.
step() { echo "== $(date -u +%H:%M:%S) $*"; }
: > "$BASELINE_CI_ENV"
# The services start in two lines side by side: the Docker Engine and those that need it (the
# egress proxy's image, sshd's check of the engine over SSH), and beside them the others
# (PostgreSQL, the hub's proxy, chromium, the egress proxy's venv). On a fresh machine the
# engine's install and image build take two minutes, which the others no longer wait behind; apt
# installs take turns (scripts/apt-install.sh). Each line stops at its first failure, and either
# failing fails the run.
engine_line=(20-docker 25-egress 30-sshd)
engine=() others=()
for service in scripts/services/*.sh; do
  [ -e "$service" ] || continue
  name=$(basename "$service" .sh)
  if [[ " ${engine_line[*]} " == *" $name "* ]]; then engine+=("$service"); else others+=("$service"); fi
done
start_line() {
  for service in "$@"; do
    step "service: $service"
    bash "$service" || { echo "service $service failed" >&2; return 1; }
  done
}
# Lint, type-check and the first collection (which compiles what the tests import, see below)
# need no service: they run beside the services' start-up, whose engine line is mostly waiting on
# downloads and builds, and are awaited before the tests.
lint_and_compile() {
  step ruff && .venv/bin/ruff check . \
    && step mypy && .venv/bin/mypy \
    && step lint-imports && .venv/bin/lint-imports --no-cache \
    && step "compiling what the tests import" \
    && { env -u PYTHONDONTWRITEBYTECODE .venv/bin/pytest -p no:cacheprovider --collect-only -q \
      "$@" > /dev/null || true; }
}
lint_log=$(mktemp /tmp/baseline-lint.XXXXXX)
lint_and_compile "$@" > "$lint_log" 2>&1 &
lint_pid=$!
engine_log=$(mktemp /tmp/baseline-services.XXXXXX)
start_line "${engine[@]}" > "$engine_log" 2>&1 &
engine_pid=$!
others_status=0
start_line "${others[@]}" || others_status=$?
engine_status=0
wait "$engine_pid" || engine_status=$?
cat "$engine_log" && rm -f "$engine_log"
lint_status=0
wait "$lint_pid" || lint_status=$?
cat "$lint_log" && rm -f "$lint_log"
[ "$lint_status" -eq 0 ] || { echo "lint, type-check or import contracts failed" >&2; exit 1; }
[ "$others_status" -eq 0 ] && [ "$engine_status" -eq 0 ] || exit 1
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
step pytest
status=0
# The tests run in pytest-xdist workers, each with its own ports, databases, deployment and
# Docker labels (tests/conftest.py, tests/ports.py); worksteal: the few long tests do not hold
# back a worker's queue of short ones. The modules that cannot share the machine with the whole
# run come after it (tests/conftest.py): QUIET_MODULES two at a time, ALONE_MODULES one by one.
# Every test's time is kept in .ci-artifacts/pytest*.xml, and the run's total, its time per area
# and its slowest tests are printed at the end.
workers="${BASELINE_TEST_WORKERS:-6}"
started=$(date +%s)
# Bytecode is cached, whatever the machine says (PYTHONDONTWRITEBYTECODE is set on some): each
# worker and every `baseline` process the tests start would otherwise compile every module it
# imports anew. The collection beside the services' start-up (above) compiled what the tests
# import (the packages were installed without compiling), once instead of once per worker.
unset PYTHONDONTWRITEBYTECODE
rm -f .ci-artifacts/pytest*.xml
.venv/bin/pytest -p no:cacheprovider -n "$workers" --dist worksteal \
  --junitxml=.ci-artifacts/pytest.xml "$@" || status=$?
if [ $# -eq 0 ]; then
  modules() { .venv/bin/python -c "from tests.conftest import $1; print(*$1)"; }
  step "pytest: the quiet modules, two at a time"
  # shellcheck disable=SC2046
  .venv/bin/pytest -p no:cacheprovider -n 2 --junitxml=.ci-artifacts/pytest-quiet.xml \
    $(modules QUIET_MODULES) || status=$?
  step "pytest: the alone modules, one by one"
  # shellcheck disable=SC2046
  .venv/bin/pytest -p no:cacheprovider --junitxml=.ci-artifacts/pytest-alone.xml \
    $(modules ALONE_MODULES) || status=$?
else
  echo "pytest: QUIET_MODULES and ALONE_MODULES (tests/conftest.py) run after a whole run only"
fi
.venv/bin/python scripts/test_times.py --wall $(($(date +%s) - started)) \
  .ci-artifacts/pytest.xml .ci-artifacts/pytest-quiet.xml .ci-artifacts/pytest-alone.xml || true
step "leak check"
bash scripts/leak-check.sh || status=1
step "done (exit $status)"
exit $status
