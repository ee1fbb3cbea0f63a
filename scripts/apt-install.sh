#!/usr/bin/env bash
# Install Debian packages for a service of scripts/services/: one apt at a time. The services
# start side by side (scripts/test.sh), and two apt-gets at once fail on apt's lock; this one
# waits for the others instead.
set -euo pipefail
exec flock /var/lock/baseline-apt.lock bash -c \
  'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null' \
  apt-install "$@"
