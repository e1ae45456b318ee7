"""Cutting files into line blocks: a plain file (read at newlines, no copies) gives the
same lines, numbers and offsets as the stream path that gzip files take (read, cut,
carry the rest); only where blocks end may differ."""

from __future__ import annotations

import gzip
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.ingest.reader import GZIP_MAGIC, ZSTD_MAGIC, iter_blocks, open_source

LINE = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x")),
    st.integers(0, 300).map(lambda n: b"y" * n),  # longer than a block
    st.sampled_from([b"", b"\r", b"  ", b'{"a": 1}\r']),
)


def _blocks(path: Path, skip_header: bool, block_bytes: int) -> list[tuple[bytes, int, int, bytes]]:
    opened = open_source(path)
    try:
        return [
            (b.data, b.first_line, b.offset, header)
            for b, header, _ in iter_blocks(
                path, opened, skip_header=skip_header, block_bytes=block_bytes
            )
        ]
    finally:
        opened.stream.close()


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(LINE, max_size=40),
    final_newline=st.booleans(),
    bom=st.booleans(),
    skip_header=st.booleans(),
    block_bytes=st.integers(1, 120),
)
def test_plain_file_blocks_equal_stream_blocks(
    tmp_path_factory: object,
    lines: list[bytes],
    final_newline: bool,
    bom: bool,
    skip_header: bool,
    block_bytes: int,
) -> None:
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines)
    data += b"\n" if final_newline and lines else b""
    assume(not data.startswith((GZIP_MAGIC, ZSTD_MAGIC)))  # that would be read as compressed
    folder = Path(tmp_path_factory.mktemp("blocks"))  # type: ignore[attr-defined]
    plain, packed = folder / "log.jsonl", folder / "log.jsonl.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    fast = _blocks(plain, skip_header, block_bytes)
    slow = _blocks(packed, skip_header, block_bytes)
    assert b"".join(b[0] for b in fast) == b"".join(b[0] for b in slow)
    assert {b[3] for b in fast} == {b[3] for b in slow}  # the header
    assert bool(fast) == bool(slow)
    for blocks in (fast, slow):
        first_line, offset = (blocks[0][1], blocks[0][2]) if blocks else (1, 0)
        for d, line, off, _ in blocks:
            assert (line, off) == (first_line, offset)
            first_line, offset = line + d.count(b"\n"), off + len(d)
    for d, _, _, _ in fast[:-1]:
        assert d.endswith(b"\n")


def test_plain_file_blocks_cut_at_the_last_newline_before_the_size(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"aaaa\nbb\ncccccc\nd\n")
    got = [(d, line, off) for d, line, off, _ in _blocks(path, False, 9)]
    assert got == [(b"aaaa\nbb\n", 1, 0), (b"cccccc\nd\n", 3, 8)]
