#!/usr/bin/env bash
# Install tracereplay with its test dependencies, the live engines' extra (the
# CPU torch build, transformers, httpx), `transformers serve` and vLLM's own
# scheduler into ./.venv, then run the whole suite: ruff (lint and format), mypy,
# and pytest (tests/live runs real engines on CPU with tiny random models;
# tests/conformance drives vLLM's scheduler and SGLang's admission code against the
# simulator).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,live,serving,conformance]'
# accelerate (which `transformers serve` loads models with) and vLLM without their
# requirements: both ask for torch, and a resolver would pull a CUDA build over the
# CPU one the extras pin.
.venv/bin/python -m pip install --quiet --no-deps 'accelerate>=1.1'
.venv/bin/python -m pip install --quiet --no-deps 'vllm==0.33.0'
# SGLang's own scheduling code for tests/conformance (its requirements pin a CUDA torch too)
.venv/bin/python -m pip install --quiet --no-deps 'sglang==0.5.23'
# The report's browser test drives Debian's chromium through Playwright (never
# `playwright install`, which downloads its own browser build).
if [ ! -x /usr/bin/chromium ]; then
    apt-get update && apt-get install -y chromium
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# one worker per core: the tests share no state beyond the numba cache (written
# atomically) and their own temporary directories
.venv/bin/python -m pytest -n auto "$@"
# the heavy variants (tests/conftest.py), which a plain `pytest` skips, when no arguments
# narrowed the run
if [ "$#" -eq 0 ]; then
    .venv/bin/python -m pytest -m heavy
fi
