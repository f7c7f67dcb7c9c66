#!/usr/bin/env bash
# Installs what the tests need and runs the whole suite (real models included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/ensure-jdk.sh  # the Java client of android_bridge is compiled and run by the tests
. .venv/bin/activate
python -m pytest -q -rs --durations=30 "$@"  # the 30 slowest: where CI's minutes go
if [ $# -eq 0 ]; then
  # The cloud engine's tests once more with every engine's decode steps compiled ([cloud] compile = on);
  # the run above had them eager (compile = auto is off), bar the tests that ask for on.
  TANDEM_CLOUD_COMPILE=on python -m pytest -q -rs tests/cloud_engine
fi
