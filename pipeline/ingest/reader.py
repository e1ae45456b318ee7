"""Opening log files: compression, encoding checks, and cutting them into line blocks.

Gzip and zstd are recognised by their magic bytes, whatever the file is called.
Every compressed frame must be complete: a gzip member or zstd frame cut short
(a copy that died half-way) or corrupt makes the whole file fail, never a
silent half of it.
Blocks end at line boundaries and carry their first line number and byte offset
(in the decompressed stream), so every record can be traced back to its place.
"""

from __future__ import annotations

import glob
import gzip
import io
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import zstandard

from pipeline.errors import SourceError
from pipeline.ingest.formats import Block

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HEAD_BYTES = 64 * 1024
PROBE_BYTES = 64 * 1024  # where a plain file's block looks for its last newline
# NOTE: 16 MiB: each block costs a few ms besides its records (polars calls, row groups),
# so 8 MiB blocks took 7% longer for 1M records; 24 MiB no less than 16, for 120 MB more
# peak memory. Below 32 MiB: glibc serves allocations above its largest mmap threshold
# with fresh pages every time, and the page faults of 32 MiB blocks cost more CPU than
# reading the file (bench/ingest_speed.py: 170k faults and 0.5 s to cut 1M records).
BLOCK_BYTES = 16 * 1024 * 1024


def expand_sources(patterns: list[str]) -> list[Path]:
    """Files named by paths, globs and directories (recursively), sorted, without repeats.

    ``s3://bucket/key-glob`` names objects (``pipeline.objectstore.fetch``).

    Inside a directory, hidden files and Markdown/reST documents are skipped.

    Raises:
        SourceError: a pattern that matches nothing.
    """
    from pipeline import objectstore

    found: list[Path] = []
    for pattern in patterns:
        if objectstore.is_remote(pattern):  # downloaded for this command, named by URI
            found.extend(objectstore.fetch(pattern))
            continue
        p = Path(pattern)
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.is_file() and not _hidden(q, p)))
        elif p.exists():
            found.append(p)
        else:
            matches = sorted(Path(m) for m in glob.glob(pattern, recursive=True))
            files = [m for m in matches if m.is_file()]
            if not files:
                raise SourceError(pattern, "no such file, directory or glob match; check the path")
            found.extend(files)
    seen: set[Path] = set()
    unique = []
    for f in found:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(f)
    return unique


def _hidden(path: Path, root: Path) -> bool:
    """Hidden files and documentation are skipped when a directory is expanded."""
    parts = path.relative_to(root).parts
    return any(p.startswith(".") for p in parts) or path.suffix.lower() in {".md", ".rst"}


@dataclass(frozen=True)
class Opened:
    stream: BinaryIO
    compression: str  # "none", "gzip" or "zstd"
    size: int  # compressed size on disk (for progress)


def open_source(path: Path) -> Opened:
    """Open a log file for reading its decompressed bytes.

    Raises:
        SourceError: the file cannot be read.
    """
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller through Opened.stream
        magic = raw.read(4)
        raw.seek(0)
        size = path.stat().st_size
    except OSError as exc:
        raise SourceError(
            str(path), f"cannot read file ({exc.strerror}); check it exists and is readable"
        ) from exc
    if magic.startswith(GZIP_MAGIC):
        return Opened(_GzipSource(raw), "gzip", size)  # type: ignore[arg-type]
    if magic.startswith(ZSTD_MAGIC):
        return Opened(io.BufferedReader(ZstdFrames(raw), 1 << 20), "zstd", size)
    return Opened(raw, "none", size)


class _GzipSource(gzip.GzipFile):
    """``gzip.GzipFile`` that closes the file it reads too: given a ``fileobj``, the
    standard one leaves it open, so every gzip log an ingest read leaked its file."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw)
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every zstd frame in ``raw``, one after the other.

    NOTE: zstandard's ``stream_reader`` ends quietly at a frame cut short, so
    half a file would read as a whole, smaller one. Here each frame gets its
    own decompressor, and input that ends inside a frame raises ``EOFError``.
    Skippable frames are skipped; bytes that are not a frame raise ZstdError.
    Compressed input is fed 256 KiB at a time, which bounds what one call
    returns (a highly compressible frame expands a lot).
    """

    def __init__(self, raw: BinaryIO, chunk: int = 1 << 18) -> None:
        super().__init__()
        self._raw = raw
        self._chunk = chunk
        self._frame: Any = None  # decompressor of the frame being read, None between frames
        self._input = b""  # compressed bytes not fed yet
        self._out = memoryview(b"")  # decompressed bytes not returned yet

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not len(self._out):
            if not self._input:
                self._input = self._raw.read(self._chunk)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("zstd frame cut short")
                    return 0
            if self._frame is None:
                self._frame = zstandard.ZstdDecompressor().decompressobj()
            data, self._input = self._input, b""
            self._out = memoryview(self._frame.decompress(data))
            if self._frame.eof:
                self._input = self._frame.unused_data
                self._frame = None
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def consumed(self) -> int:
        """Compressed bytes read so far (for progress)."""
        return int(self._raw.tell())

    def close(self) -> None:
        self._raw.close()
        super().close()


def _read(path: Path, opened: Opened, n: int) -> bytes:
    try:
        return opened.stream.read(n)
    except EOFError as exc:
        raise SourceError(
            str(path),
            f"{opened.compression} data is truncated (the file was cut "
            "short); re-copy or re-export it, nothing from it was kept",
        ) from exc
    except (OSError, zlib.error, zstandard.ZstdError) as exc:
        raise SourceError(
            str(path),
            f"corrupt {opened.compression} data ({exc}); re-copy or "
            "re-export it, nothing from it was kept",
        ) from exc


def read_all(path: Path, opened: Opened) -> bytes:
    """Every decompressed byte of the file."""
    return _read(path, opened, -1)


def check_encoding(path: Path, head: bytes) -> None:
    """Reject files that are not UTF-8 text as a whole (UTF-16/32, binary).

    Single bad bytes in an otherwise UTF-8 file are handled per record.
    """
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or (
        head and head.count(b"\x00") > len(head) // 8
    ):
        raise SourceError(
            str(path),
            "not UTF-8 text (looks like UTF-16 or binary); convert it "
            "with `iconv -f UTF-16 -t UTF-8` or pass the right file",
        )


def read_head(path: Path) -> bytes:
    """The first bytes of the decompressed file (for format detection)."""
    opened = open_source(path)
    try:
        return _read(path, opened, HEAD_BYTES)
    finally:
        opened.stream.close()


def iter_blocks(
    path: Path, opened: Opened, *, skip_header: bool, block_bytes: int = BLOCK_BYTES
) -> Iterator[tuple[Block, bytes, int]]:
    """Yield (block of whole lines, header line, compressed bytes consumed so far).

    The header (first line) is split off when ``skip_header`` is set and
    returned with every block. A missing final newline is tolerated; a UTF-8
    byte order mark is skipped.
    """
    read = _aligned_reader(path, opened, block_bytes)
    header = b""
    line = 1
    offset = 0
    carry = b""
    first = True
    yielded = False
    while True:
        chunk = read()
        if first and chunk:
            first = False
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk, offset = chunk[3:], 3
                chunk = chunk or read()  # empty is the end of the file only after a read
            if skip_header:
                while b"\n" not in chunk:
                    more = read()
                    if not more:
                        break
                    chunk += more
                nl = chunk.find(b"\n")
                header, chunk = (chunk, b"") if nl < 0 else (chunk[: nl + 1], chunk[nl + 1 :])
                offset += len(header)
                line += 1
                chunk = chunk or read()
        if not chunk:
            if carry or (header and not yielded):
                # the last line, or an empty block after a lone first line (a header,
                # or a record of a format that may lack one)
                yield Block(carry, line, offset), header, opened.size
            return
        cut = chunk.rfind(b"\n")
        if cut < 0:
            carry += chunk
            continue
        # at most one copy: the carried start of a line and this chunk up to its last newline
        # (none for a plain file, whose chunks end at a newline: slicing all of it is free)
        data = b"".join((carry, memoryview(chunk)[: cut + 1])) if carry else chunk[: cut + 1]
        carry = chunk[cut + 1 :]
        yield Block(data, line, offset), header, _tell(opened)
        yielded = True
        line += count_lines(data)
        offset += len(data)


def _aligned_reader(path: Path, opened: Opened, block_bytes: int) -> Callable[[], bytes]:
    """A function returning the next chunk of the file (b"" at its end).

    For a plain (uncompressed, seekable) file, each chunk of about ``block_bytes``
    ends at a newline: the last one in the block's final ``PROBE_BYTES`` is found
    first, then exactly that much is read. So ``iter_blocks`` never copies a block
    to cut it at a line or to join a line carried over from the chunk before.

    NOTE: that copy of a block held the GIL (with the page faults of a fresh block),
    stalling the parse threads' Python for ~0.1-0.2 s per 1M records on 2 cores.
    """
    stream = opened.stream
    try:
        pos = stream.tell() if opened.compression == "none" and stream.seekable() else -1
    except (OSError, ValueError):
        pos = -1
    if pos < 0:
        return lambda: _read(path, opened, block_bytes)

    def read() -> bytes:
        nonlocal pos
        probe = max(block_bytes - PROBE_BYTES, 0)
        stream.seek(pos + probe)
        window = _read(path, opened, block_bytes - probe)
        nl = window.rfind(b"\n")
        # at the end of the file, or no newline near the block's end (a very long line):
        # a plain read, the caller carries what follows the last newline
        n = block_bytes if len(window) < block_bytes - probe or nl < 0 else probe + nl + 1
        stream.seek(pos)
        chunk = _read(path, opened, n)
        pos += len(chunk)
        return chunk

    return read


def _tell(opened: Opened) -> int:
    try:
        if opened.compression == "zstd":
            return int(opened.stream.raw.consumed())  # type: ignore[attr-defined]
        raw = getattr(opened.stream, "fileobj", None) or opened.stream
        return int(raw.tell())
    except (OSError, ValueError):
        return 0


_SCRATCH = threading.local()


def _is_newline(data: bytes) -> npt.NDArray[np.bool_]:
    """``data == b"\\n"`` byte by byte, in a buffer the calling thread keeps for the next block.

    NOTE: a fresh 8 MiB mask costs ~2000 page faults (glibc returns large
    freed blocks to the system): ~2 ms a block, twice the compare itself. The
    buffer goes with its thread (the parse threads end with each file).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    mask = getattr(_SCRATCH, "mask", None)
    if mask is None or len(mask) < len(buf):
        mask = _SCRATCH.mask = np.empty(len(buf), dtype=np.bool_)
    out: npt.NDArray[np.bool_] = mask[: len(buf)]
    np.equal(buf, 10, out=out)
    return out


def count_lines(data: bytes) -> int:
    """The number of newlines in ``data`` (numpy: 4x ``bytes.count``)."""
    return int(np.count_nonzero(_is_newline(data)))


def line_starts(data: bytes) -> npt.NDArray[np.int64]:
    """Byte offset of the start of every line in ``data`` (one entry per line)."""
    nl = np.flatnonzero(_is_newline(data))
    starts = np.empty(len(nl) + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    if starts[-1] >= len(data):  # data ends with a newline: no line after it
        starts = starts[:-1]
    return starts
