"""The nightly inbox: which log files are new or changed since they were last ingested.

The inbox is a list of globs. A file is identified by its resolved path and
its content (SHA-256); the manifest ``<warehouse>/nightly/inbox.json`` maps
each path to the hash it had when it was ingested. A file whose path is not
in the manifest, or whose hash differs, is new; anything else is skipped.
The manifest is rewritten (atomically) only after the files landed, so a
killed night ingests them again the next time, which changes nothing
(re-ingesting a file replaces what it wrote).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError

MANIFEST = Path("nightly") / "inbox.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class InboxFile:
    path: Path  # resolved
    sha256: str
    size: int


def content_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def expand(globs: list[str], base: Path | None = None) -> list[Path]:
    """Every file the globs match (relative globs from ``base``), resolved, sorted, once.

    A ``s3://bucket/key-glob`` names objects: they are downloaded for the night
    (``pipeline.objectstore.fetch``) and known by their URI (``name``).

    Raises:
        ConfigError: a glob that is not a string.
    """
    from pipeline import objectstore

    out: set[Path] = set()
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"inbox: {pattern!r} is not a glob; give strings like 'logs/*.gz'")
        if objectstore.is_remote(pattern):  # fetched for this night, known by URI
            out.update(p.resolve() for p in objectstore.fetch(pattern, must_match=False))
            continue
        full = pattern if base is None or os.path.isabs(pattern) else str(base / pattern)
        for hit in glob.glob(os.path.expanduser(full), recursive=True):
            p = Path(hit)
            if p.is_file():
                out.add(p.resolve())
    return sorted(out)


def load_manifest(warehouse: Path) -> dict[str, str]:
    """Path -> content hash of every inbox file ingested so far."""
    path = warehouse / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(
            f"{path}: not valid JSON ({exc}); delete it to ingest the whole inbox again"
        ) from None
    files = data.get("files", {}) if isinstance(data, dict) else {}
    return {str(k): str(v) for k, v in files.items()}


def save_manifest(warehouse: Path, files: dict[str, str]) -> None:
    from pipeline.storage import write_atomic

    write_atomic(
        warehouse / MANIFEST, json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n"
    )


def name(path: Path) -> str:
    """How the manifest names an inbox file: its path, or the URI it was fetched from."""
    from pipeline.objectstore import source_name

    return source_name(path)


def new_or_changed(paths: list[Path], manifest: dict[str, str]) -> tuple[list[InboxFile], int]:
    """(the files to ingest, how many were skipped as already ingested)."""
    todo: list[InboxFile] = []
    skipped = 0
    for p in paths:
        digest = content_hash(p)
        if manifest.get(name(p)) == digest:
            skipped += 1
        else:
            todo.append(InboxFile(p, digest, p.stat().st_size))
    return todo, skipped
