#!/usr/bin/env bash
# PostgreSQL for the model tests: install if missing, start a throw-away cluster on 127.0.0.1.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  bash "$(dirname "$0")/../apt-install.sh" postgresql
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
data=/tmp/baseline-pg
port=55432
if ! "$bin/pg_isready" -h 127.0.0.1 -p $port -q 2>/dev/null; then
  rm -rf "$data"; mkdir -p "$data"; chown postgres "$data"
  su postgres -c "$bin/initdb -D $data -A trust -U postgres" >/dev/null
  su postgres -c "$bin/pg_ctl -D $data -o '-p $port -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off' -l $data/log -w start" >/dev/null
fi
"$bin/pg_isready" -h 127.0.0.1 -p $port
echo "BASELINE_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:$port/postgres" >> "$BASELINE_CI_ENV"
