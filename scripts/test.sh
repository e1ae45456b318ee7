#!/usr/bin/env bash
# Install tracereplay with its test dependencies into ./.venv, then run the
# whole suite: ruff (lint and format), mypy, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,conformance]'
# vLLM's own scheduler for tests/conformance, without its requirements (they
# would pull a CUDA torch; the extra above has the CPU one and what it imports).
.venv/bin/python -m pip install --quiet --no-deps 'vllm==0.33.0'
# The report's browser test drives Debian's chromium through Playwright (never
# `playwright install`, which downloads its own browser build).
if [ ! -x /usr/bin/chromium ]; then
    apt-get update && apt-get install -y chromium
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
