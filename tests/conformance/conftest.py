"""The conformance suite needs vLLM (``pip install -e '.[conformance]'`` and vLLM itself
with ``--no-deps``, as ``scripts/test.sh`` does); the full set runs only when asked for
with ``-m conformance_full``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "conformance_full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full set: pytest tests/conformance -m conformance_full")
    for item in items:
        if "conformance_full" in item.keywords:
            item.add_marker(skip)
