#!/usr/bin/env bash
# Install tracereplay with its test dependencies and the live engines' extra
# (the CPU torch build, transformers, httpx) into ./.venv, then run the whole
# suite: ruff (lint and format), mypy, and pytest (tests/live runs real engines
# on CPU with tiny random models, in a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,live]'
# The report's browser test drives Debian's chromium through Playwright (never
# `playwright install`, which downloads its own browser build).
if [ ! -x /usr/bin/chromium ]; then
    apt-get update && apt-get install -y chromium
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
