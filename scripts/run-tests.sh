#!/usr/bin/env bash
# Installs what the tests need and runs the whole suite (real models included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
python -m pytest -q "$@"
