#!/usr/bin/env bash
# Reproduce "Small Models, Solid Digits": writes results/ (metrics, learning curve, confusion).
set -euo pipefail
cd "$(dirname "$0")"
python3 reproduce.py --out results
