"""docs/api.md's worked example runs as written: its python blocks, in order, in one
namespace, from the repository root (so the docs cannot rot)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_the_doc_has_the_worked_example() -> None:
    blocks = python_blocks(DOC.read_text())
    code = "\n".join(blocks)
    assert len(blocks) >= 4
    for call in ("api.ingest(", "api.replay(", "api.capacity(", "api.query("):
        assert call in code


def test_the_api_doc_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("TRACEREPLAY_CONFIG", "TRACEREPLAY_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's warehouse
    namespace: dict[str, object] = {"__name__": "api_md"}
    for i, block in enumerate(python_blocks(DOC.read_text()), 1):
        exec(compile(block, f"{DOC.name} block {i}", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    assert "read 600, kept 600" in printed  # the bundled sample's 600 requests
    assert "seqs-8: " in printed and "seqs-64: " in printed
    assert list(tmp_path.glob("*/warehouse/requests"))  # it wrote where it said
