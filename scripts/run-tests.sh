#!/usr/bin/env bash
# Installs what the tests need and runs the whole suite (real models included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/ensure-jdk.sh  # the Java client of android_bridge is compiled and run by the tests
. .venv/bin/activate
python -m pytest -q -rs --durations=30 "$@"  # the 30 slowest: where CI's minutes go
