"""Fixtures of the held corpus: file-system faults (``disk.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.corpus.disk import Fault, faults


@pytest.fixture
def fault() -> Iterator[Callable[..., Fault]]:
    """``fault(kind, root, size=..., slack=...)``: a prepared fault on ``root`` (a tmpfs
    mounted there for a real ``full`` or ``readonly``), disarmed and unmounted at teardown
    whatever the case did."""
    with faults() as make:
        yield make
