"""``bench/_measure.record`` rewrites a section of RESULTS.md and keeps its hand notes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _measure  # noqa: E402

BEFORE = """# Benchmark results

## First

Command: `python bench/first.py` (2026-01-01, 2-core machine)

| a |
|---|
| 1 |

Notes by hand (the bench keeps them when it rewrites this section):

Why the figure is what it is.

## Second

Command: `python bench/second.py` (2026-01-01, 2-core machine)

old figures, no notes
"""


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    monkeypatch.setattr(_measure, "RESULTS", path)
    return path


def test_new_figures_replace_the_old_and_the_notes_stay(results: Path) -> None:
    _measure.record("First", "python bench/first.py", "| a |\n|---|\n| 2 |")
    text = results.read_text()
    first = text[text.index("## First") : text.index("## Second")]
    assert "| 2 |" in first and "| 1 |" not in first
    assert first.index("| 2 |") < first.index(_measure.NOTES) < first.index("Why the figure")
    assert text[text.index("## Second") :] == BEFORE[BEFORE.index("## Second") :]


def test_a_section_without_notes_is_replaced_whole(results: Path) -> None:
    _measure.record("Second", "python bench/second.py", "new figures \\1 (a backslash)")
    text = results.read_text()
    second = text[text.index("## Second") :]
    assert "new figures \\1 (a backslash)" in second and "old figures" not in second
    assert _measure.NOTES not in second
    assert text[: text.index("## Second")] == BEFORE[: BEFORE.index("## Second")]


def test_a_new_section_goes_at_the_end(results: Path) -> None:
    _measure.record("Third", "python bench/third.py", "figures")
    text = results.read_text()
    assert text.startswith(BEFORE.rstrip())
    assert text.rstrip().endswith("figures")
