"""Shared fixtures: the real public traces, golden files; the hypothesis profiles.

The builders of test data are plain functions in tests/helpers.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers import TRACES_RAW

GOLDEN = Path(__file__).resolve().parent / "golden"

# No deadline (the first example of a simulator test compiles it); CI derandomizes, so a
# run is repeatable from its commit.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite tests/golden files.")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``heavy`` tests run only when asked for (``pytest -m heavy``; scripts/test.sh does,
    after the rest): each is the end-to-end variant of a claim a fast test of the default
    set also checks, and costs minutes (a full compile of the simulator)."""
    if "heavy" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a heavy variant: pytest -m heavy")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def traces_raw() -> Path:
    if not TRACES_RAW.exists():
        pytest.fail(f"the real public traces are expected beside the project at {TRACES_RAW}")
    return TRACES_RAW


@pytest.fixture
def golden(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """golden(name, actual): compare a JSON-able value with tests/golden/<name>.json."""
    update = request.config.getoption("--update-golden")

    def check(name: str, actual: object) -> None:
        path = GOLDEN / f"{name}.json"
        text = json.dumps(actual, indent=1, sort_keys=True) + "\n"
        if update or not path.exists():
            path.write_text(text)
        assert json.loads(path.read_text()) == json.loads(text), f"golden {path.name} differs"

    return check
