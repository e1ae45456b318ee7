"""Log formats: one module per format, and the registry that detects them.

A format turns a block of a decompressed log into rows in the canonical shape.
It does not validate values (negative counts, missing fields, duplicate ids):
``pipeline.ingest.validate`` does that once for every format, so every format
rejects bad records the same way.

Line-based formats (JSONL, CSV) receive blocks of whole lines; the ingest
driver cuts the file at line boundaries and tracks line numbers and byte
offsets. Whole-document formats (``line_based = False``) receive the whole
file as one block.

What ``parse`` returns:

* ``rows``: one row per record that could be read, with any of the canonical
  columns the format knows (``CANONICAL``) plus ``source_line`` (Int64, 1-based)
  and ``byte_offset`` (Int64). Arrival is either ``arrival_time``
  (Datetime("us", "UTC")) for absolute clocks or ``arrival_offset_s`` (Float64,
  seconds from the trace start) for relative ones. Missing values are null;
  the validator decides whether that is allowed.
  A format may add a ``_reject`` String column: a non-null value rejects the
  row with that reason (e.g. a failed call in a gateway log).
* ``rejects``: records that could not be read at all (corrupt JSON, wrong field
  count, bad encoding): ``source_line``, ``byte_offset``, ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import polars as pl

# Canonical columns a format may produce (names and dtypes as in the requests contract).
CANONICAL: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "arrival_time": pl.Datetime("us", "UTC"),
    "arrival_offset_s": pl.Float64(),
    "prompt_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "max_tokens": pl.Int64(),
    "block_size": pl.Int32(),
    "prefix_hashes": pl.List(pl.UInt64()),
    "output_hashes": pl.List(pl.UInt64()),
    "model": pl.String(),
    "tenant": pl.String(),
    "priority": pl.Int64(),
    "session_id": pl.String(),
    "parent_id": pl.String(),
    "turn": pl.Int64(),
    "observed_ttft_s": pl.Float64(),
    "observed_e2e_s": pl.Float64(),
    "observed_queue_s": pl.Float64(),
    "cached_tokens": pl.Int64(),
}

REJECT_SCHEMA = {"source_line": pl.Int64(), "byte_offset": pl.Int64(), "reason": pl.String()}


@dataclass(frozen=True)
class Block:
    """A slice of a decompressed log file."""

    data: bytes  # whole lines (line-based formats) or the whole file
    first_line: int  # 1-based line number of the first line of data
    offset: int  # byte offset of data in the decompressed file


@dataclass(frozen=True)
class ParseOptions:
    """Settings a format may need; the driver fills them from flags and config."""

    path: Path = Path("-")
    header: bytes = b""  # first line of a CSV file (blocks exclude it)
    block_size: int | None = None  # hash block size override (Mooncake 512, Bailian 16, ...)
    hash_salt: str = ""  # mixed into the first block hash (token-id logs)
    tokenizer: Path | None = None  # tokenizer.json for logs that carry text only
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Parsed:
    rows: pl.DataFrame
    rejects: pl.DataFrame

    @staticmethod
    def no_rejects() -> pl.DataFrame:
        return pl.DataFrame(schema=REJECT_SCHEMA)


class LogFormat(Protocol):
    """What every format module provides (as module-level names)."""

    name: str  # the --format value
    line_based: bool  # False: parse() gets the whole file
    has_header: bool  # True: the first line is a header, passed as ParseOptions.header
    may_hold_text: bool  # records may carry text (JSON: any field): never keep raw excerpts

    def sniff(self, head: bytes) -> bool:
        """True when the first bytes of a decompressed file look like this format."""
        ...

    def parse(self, block: Block, opts: ParseOptions) -> Parsed:
        """Read the records of one block (see the module docstring)."""
        ...


def _load() -> dict[str, LogFormat]:
    import importlib

    names = ["azure", "mooncake", "bailian", "burstgpt", "gateway", "otel", "token_ids"]
    found: dict[str, LogFormat] = {}
    for n in names:
        try:
            mod = importlib.import_module(f"pipeline.ingest.formats.{n}")
        except ModuleNotFoundError as exc:  # a format still being written
            if exc.name != f"pipeline.ingest.formats.{n}":
                raise
            continue
        found[mod.name] = mod  # type: ignore[assignment]
    return found


FORMATS: dict[str, LogFormat] = _load()


def detect(head: bytes) -> LogFormat | None:
    """The first format whose sniff() accepts the head of the file (registry order).

    A UTF-8 byte order mark is skipped (the readers skip it too).
    """
    head = head.removeprefix(b"\xef\xbb\xbf")
    for fmt in FORMATS.values():
        if fmt.sniff(head):
            return fmt
    return None
