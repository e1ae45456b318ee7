"""What a refused command must leave alone: the files under some folders, and the names
an attempt could write in the system temporary directory."""

from __future__ import annotations

import tempfile
from pathlib import Path


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``roots`` (folders that exist): path -> (size, mtime_ns)."""
    out = {}
    for root in roots:
        if root.is_dir():
            for p in root.rglob("*"):
                if p.is_file():
                    st = p.stat()
                    out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def tmp_entries(names: set[str]) -> set[str]:
    """Which of ``names`` stand in the system temporary directory.

    Other programs use the temporary directory too, so only names an attempt writes are
    compared.
    """
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name in names}
