#!/usr/bin/env bash
# Install tracereplay into ./.venv and run the main job end to end on the
# bundled sample log, writing to ./warehouse. Extra arguments go to `tracereplay run`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/tracereplay run "$@"
